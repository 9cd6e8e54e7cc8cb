#include "welcome/welcome_page.h"

#include <QButtonGroup>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QLocale>
#include <QProgressBar>
#include <QPushButton>
#include <QRadioButton>
#include <QRegularExpression>
#include <QSettings>
#include <QVBoxLayout>

namespace atelier::ui {

QStringList WelcomePage::defaultModels() { return {QStringLiteral("stories260k"), QStringLiteral("quickdraw")}; }

WelcomePage::WelcomePage(bridge::StoreWorker* store, QWidget* parent) : QWidget(parent), store_(store) {
  setObjectName(QStringLiteral("welcomePage"));
  auto* title = new QLabel(tr("<h2>Welcome to Atelier</h2>"), this);
  auto* text = new QLabel(tr("No models are installed yet. Install the default models to start: "
                             "<b>stories260k</b> (a small text model that writes short stories) and "
                             "<b>quickdraw</b> (an image model that draws doodles of 50 things). "
                             "Both are small (about 1.5 MB) and run on any computer."),
                          this);
  text->setWordWrap(true);
  fromCatalog_ = new QRadioButton(tr("Download from the catalog's addresses (internet)"), this);
  fromCatalog_->setObjectName(QStringLiteral("fromCatalog"));
  fromMirror_ = new QRadioButton(tr("Copy from a mirror folder:"), this);
  fromMirror_->setObjectName(QStringLiteral("fromMirror"));
  auto* group = new QButtonGroup(this);
  group->addButton(fromCatalog_);
  group->addButton(fromMirror_);
  mirror_ = new QLineEdit(QSettings().value(QStringLiteral("models/mirror")).toString(), this);
  mirror_->setObjectName(QStringLiteral("welcomeMirror"));
  mirror_->setAccessibleName(tr("Mirror folder"));
  mirror_->setPlaceholderText(tr("a folder holding the catalog's files (e.g. shared/fixtures)"));
  auto* browse = new QPushButton(tr("Browse..."), this);
  browse->setObjectName(QStringLiteral("welcomeBrowse"));
  (mirror_->text().isEmpty() ? fromCatalog_ : fromMirror_)->setChecked(true);
  install_ = new QPushButton(tr("&Install the default models"), this);
  install_->setObjectName(QStringLiteral("installButton"));
  install_->setDefault(true);
  cancel_ = new QPushButton(tr("Cancel"), this);
  cancel_->setObjectName(QStringLiteral("welcomeCancel"));
  cancel_->setEnabled(false);
  skip_ = new QPushButton(tr("&Skip (I will import my own)"), this);
  skip_->setObjectName(QStringLiteral("skipButton"));
  progress_ = new QProgressBar(this);
  progress_->setObjectName(QStringLiteral("welcomeProgress"));
  progress_->setAccessibleName(tr("Install progress"));
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  status_ = new QLabel(this);
  status_->setObjectName(QStringLiteral("welcomeStatus"));
  status_->setWordWrap(true);

  auto* mirrorRow = new QHBoxLayout;
  mirrorRow->addWidget(fromMirror_);
  mirrorRow->addWidget(mirror_, 1);
  mirrorRow->addWidget(browse);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(install_);
  buttons->addWidget(cancel_);
  buttons->addStretch(1);
  buttons->addWidget(skip_);
  auto* box = new QWidget(this);
  box->setMaximumWidth(720);
  auto* v = new QVBoxLayout(box);
  v->addWidget(title);
  v->addWidget(text);
  v->addSpacing(12);
  v->addWidget(fromCatalog_);
  v->addLayout(mirrorRow);
  v->addSpacing(12);
  v->addLayout(buttons);
  v->addWidget(progress_);
  v->addWidget(status_);
  auto* outer = new QVBoxLayout(this);
  outer->addStretch(1);
  auto* h = new QHBoxLayout;
  h->addStretch(1);
  h->addWidget(box, 3);
  h->addStretch(1);
  outer->addLayout(h);
  outer->addStretch(2);

  connect(browse, &QPushButton::clicked, this, [this] {
    const QString d = QFileDialog::getExistingDirectory(this, tr("Mirror folder"), mirror_->text());
    if (!d.isEmpty()) setMirror(d);
  });
  connect(mirror_, &QLineEdit::textEdited, this, [this] { fromMirror_->setChecked(true); });
  connect(install_, &QPushButton::clicked, this, &WelcomePage::install);
  connect(cancel_, &QPushButton::clicked, this, [this] {
    store_->cancel();
    status_->setText(tr("cancelling after the file in progress..."));
  });
  connect(skip_, &QPushButton::clicked, this, &WelcomePage::skipped);
  connect(store_, &bridge::StoreWorker::progress, this, [this](const QString& what, qint64 done, qint64 total) {
    if (!running_) return;
    status_->setText(what);
    if (total > 0) {
      progress_->setRange(0, 1000);
      progress_->setValue(static_cast<int>(1000.0 * static_cast<double>(done) / static_cast<double>(total)));
      progress_->setFormat(QStringLiteral("%1 / %2").arg(QLocale().formattedDataSize(done), QLocale().formattedDataSize(total)));
    } else {
      progress_->setRange(0, 0);
    }
  });
}

void WelcomePage::setMirror(const QString& folder) {
  mirror_->setText(folder);
  fromMirror_->setChecked(true);
}

QString WelcomePage::message() const { return status_->text(); }

void WelcomePage::install() {
  if (running_) return;
  const QString mirror = fromMirror_->isChecked() ? mirror_->text().trimmed() : QString();
  if (fromMirror_->isChecked() && mirror.isEmpty()) {
    status_->setText(tr("Choose the mirror folder first (or download from the catalog)"));
    return;
  }
  running_ = true;
  install_->setEnabled(false);
  skip_->setEnabled(false);
  cancel_->setEnabled(true);
  status_->setText(tr("installing..."));
  if (!mirror.isEmpty()) QSettings().setValue(QStringLiteral("models/mirror"), mirror);
  store_->pull(defaultModels(), mirror, bridge::while_alive(this, [this](Status s) {
    running_ = false;
    install_->setEnabled(true);
    skip_->setEnabled(true);
    cancel_->setEnabled(false);
    progress_->setRange(0, 1000);
    if (!s.ok()) {
      // The store's messages are written for the command line ("--mirror DIR"); this page has a field for it.
      QString why = QString::fromStdString(s.message);
      why.replace(QRegularExpression(QStringLiteral("--mirror DIR( \\(or ATELIER_MODEL_MIRROR\\))?")),
                  tr("a mirror folder (choose \"Copy from a mirror folder\" above)"));
      status_->setText(tr("The install did not finish: %1").arg(why));
      return;
    }
    progress_->setValue(1000);
    status_->setText(tr("Installed %1").arg(defaultModels().join(QStringLiteral(", "))));
    emit installed();
  }));
}

}  // namespace atelier::ui
