#include "main_window.h"

#include <atelier/engine.h>

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
  std::vector<std::string> folders;
  for (const QString& f : modelFolders_) folders.push_back(f.toStdString());
  const std::vector<atelier::ModelFile> models = atelier::scan_model_folders(folders);
  table_->setRowCount(static_cast<int>(models.size()));
  for (int row = 0; row < static_cast<int>(models.size()); ++row) {
    const atelier::ModelFile& m = models[static_cast<size_t>(row)];
    auto* name = new QTableWidgetItem(QString::fromStdString(m.path).section('/', -1));
    name->setToolTip(QString::fromStdString(m.path));
    table_->setItem(row, 0, name);
    table_->setItem(row, 1, new QTableWidgetItem(QString::fromStdString(m.kind)));
    table_->setItem(row, 2, new QTableWidgetItem(QString::fromStdString(m.format)));
    table_->setItem(row, 3, new QTableWidgetItem(QLocale().formattedDataSize(m.bytes)));
    table_->setItem(row, 4, new QTableWidgetItem(QString::fromStdString(m.summary)));
  }
  table_->resizeColumnsToContents();
  status_->setText(tr("%n model file(s) in %1", nullptr, static_cast<int>(models.size()))
                       .arg(modelFolders_.join(QStringLiteral(", "))));
}
