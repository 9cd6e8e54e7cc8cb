#include "main_window.h"

#include <atelier/engine.h>
#include <atelier/store.h>

#include <QHeaderView>
#include <QLabel>
#include <QTableWidget>
#include <QToolBar>
#include <QVBoxLayout>

MainWindow::MainWindow(QStringList modelFolders, QWidget* parent)
    : QMainWindow(parent), modelFolders_(std::move(modelFolders)) {
  setWindowTitle(tr("Atelier"));
  auto* central = new QWidget(this);
  auto* layout = new QVBoxLayout(central);
  auto* heading = new QLabel(tr("<b>Models</b>"), central);
  layout->addWidget(heading);
  table_ = new QTableWidget(0, 5, central);
  table_->setHorizontalHeaderLabels({tr("Name"), tr("Kind"), tr("Format"), tr("Size"), tr("Details")});
  table_->horizontalHeader()->setSectionResizeMode(4, QHeaderView::Stretch);
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  layout->addWidget(table_);
  status_ = new QLabel(central);
  status_->setWordWrap(true);
  layout->addWidget(status_);
  setCentralWidget(central);

  QToolBar* bar = addToolBar(tr("Models"));
  bar->addAction(tr("Refresh"), this, &MainWindow::refreshModels);
  resize(960, 480);
  refreshModels();
}

void MainWindow::refreshModels() {
  // Store models first (by name@version, what requests name), then loose files.
  struct Row {
    QString name, tip, kind, format, details;
    qint64 bytes = 0;
  };
  std::vector<Row> rows;
  int stored = 0;
  if (auto store = atelier::Store::open(atelier::default_store_dir(), /*create=*/false); store.ok()) {
    if (auto models = store.value()->list(); models.ok()) {
      for (const atelier::StoreModel& m : models.value()) {
        for (const atelier::StoreVersion& v : m.versions) {
          qint64 bytes = 0;
          for (const auto& f : v.files) bytes += f.size;
          QString channels;
          for (const auto& c : v.channels) channels += (channels.isEmpty() ? "" : ",") + QString::fromStdString(c);
          rows.push_back({QString::fromStdString(m.name + "@" + std::to_string(v.number)),
                          QStringLiteral("sha256:") + QString::fromStdString(v.digest), QString::fromStdString(v.kind),
                          QString::fromStdString(v.format),
                          tr("store: %1%2, sha256:%3")
                              .arg(QString::fromStdString(v.architecture.empty() ? v.format : v.architecture),
                                   channels.isEmpty() ? QString() : tr(" [%1]").arg(channels),
                                   QString::fromStdString(v.digest.substr(0, 12))),
                          bytes});
          ++stored;
        }
      }
    }
  }
  std::vector<std::string> folders;
  for (const QString& f : modelFolders_) folders.push_back(f.toStdString());
  const std::vector<atelier::ModelFile> files = atelier::scan_model_folders(folders);
  for (const atelier::ModelFile& m : files)
    rows.push_back({QString::fromStdString(m.path).section('/', -1), QString::fromStdString(m.path), QString::fromStdString(m.kind),
                    QString::fromStdString(m.format), QString::fromStdString(m.summary), m.bytes});
  table_->setRowCount(static_cast<int>(rows.size()));
  for (int row = 0; row < static_cast<int>(rows.size()); ++row) {
    const Row& r = rows[static_cast<size_t>(row)];
    auto* name = new QTableWidgetItem(r.name);
    name->setToolTip(r.tip);
    table_->setItem(row, 0, name);
    table_->setItem(row, 1, new QTableWidgetItem(r.kind));
    table_->setItem(row, 2, new QTableWidgetItem(r.format));
    table_->setItem(row, 3, new QTableWidgetItem(QLocale().formattedDataSize(r.bytes)));
    table_->setItem(row, 4, new QTableWidgetItem(r.details));
  }
  table_->resizeColumnsToContents();
  QString text = tr("%n model file(s) in %1", nullptr, static_cast<int>(files.size())).arg(modelFolders_.join(QStringLiteral(", ")));
  if (stored > 0) text = tr("%n store model version(s) in %1; ", nullptr, stored).arg(QString::fromStdString(atelier::default_store_dir())) + text;
  status_->setText(text);
}
