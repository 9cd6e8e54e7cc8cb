#include "studio/studio_window.h"

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMimeData>
#include <QPalette>
#include <QPushButton>
#include <QSettings>
#include <QStatusBar>
#include <QStyleFactory>
#include <QTabWidget>
#include <QTimer>

#include "gallery/gallery_view.h"
#include "paint/paint_tab.h"
#include "queue/queue_view.h"
#include "write/conversation_store.h"
#include "write/write_tab.h"

namespace atelier::ui {

void StudioWindow::applyTheme(const QString& theme) {
  QApplication::setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
  if (theme == QLatin1String("light")) {
    QApplication::setPalette(QApplication::style()->standardPalette());
    return;
  }
  QPalette p;
  const QColor window(45, 45, 48), base(30, 30, 32), text(225, 225, 225), accent(64, 128, 214);
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, window);
  p.setColor(QPalette::ToolTipBase, QColor(60, 60, 64));
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::PlaceholderText, QColor(140, 140, 140));
  p.setColor(QPalette::Button, window);
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, Qt::red);
  p.setColor(QPalette::Link, QColor(110, 170, 255));
  p.setColor(QPalette::LinkVisited, QColor(150, 150, 255));
  p.setColor(QPalette::Highlight, accent);
  p.setColor(QPalette::HighlightedText, Qt::white);
  for (auto role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
    p.setColor(QPalette::Disabled, role, QColor(120, 120, 120));
  p.setColor(QPalette::Disabled, QPalette::Base, QColor(40, 40, 42));
  QApplication::setPalette(p);
}

StudioWindow::StudioWindow(StudioOptions options, QWidget* parent) : QMainWindow(parent), options_(std::move(options)) {
  setObjectName(QStringLiteral("studioWindow"));
  setWindowTitle(tr("Atelier"));
  setAcceptDrops(true);
  if (options_.dataDir.isEmpty()) options_.dataDir = bridge::defaultDataDir();
  bridge::EngineBridge::Options bo;
  bo.dataDir = options_.dataDir;
  bo.modelFolders = options_.modelFolders;
  bo.threads = options_.threads;
  bridge_ = new bridge::EngineBridge(bo, this);
  conversations_ = new ConversationStore(options_.dataDir);

  tabs_ = new QTabWidget(this);
  tabs_->setObjectName(QStringLiteral("workspaces"));
  tabs_->setDocumentMode(true);
  write_ = new WriteTab(bridge_, conversations_, tabs_);
  paint_ = new PaintTab(bridge_, tabs_);
  tabs_->addTab(write_, tr("&Write"));
  tabs_->addTab(paint_, tr("&Paint"));
  setCentralWidget(tabs_);

  queue_ = new QueueView(bridge_, this);
  queueDock_ = new QDockWidget(tr("Queue"), this);
  queueDock_->setObjectName(QStringLiteral("queueDock"));
  queueDock_->setWidget(queue_);
  addDockWidget(Qt::BottomDockWidgetArea, queueDock_);
  gallery_ = new GalleryView(this);
  galleryDock_ = new QDockWidget(tr("Gallery"), this);
  galleryDock_->setObjectName(QStringLiteral("galleryDock"));
  galleryDock_->setWidget(gallery_);
  addDockWidget(Qt::RightDockWidgetArea, galleryDock_);

  engineLabel_ = new QLabel(tr("opening the engine..."), this);
  engineLabel_->setObjectName(QStringLiteral("engineStatus"));
  statsLabel_ = new QLabel(this);
  statsLabel_->setObjectName(QStringLiteral("writeStats"));
  // Room for the longest figures, so the label does not jump or clip while tokens stream.
  statsLabel_->setMinimumWidth(statsLabel_->fontMetrics().horizontalAdvance(QStringLiteral("9999.9 tokens/s · 9999 tokens · context 9999/9999")));
  statsLabel_->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  statusBar()->addPermanentWidget(statsLabel_);
  statusBar()->addPermanentWidget(engineLabel_);

  connect(write_, &WriteTab::statsChanged, statsLabel_, &QLabel::setText);
  connect(write_, &WriteTab::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(paint_, &PaintTab::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(queue_, &QueueView::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(gallery_, &GalleryView::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(paint_, &PaintTab::imagesSaved, gallery_, &GalleryView::addImages);
  connect(gallery_, &GalleryView::reuseParameters, this, [this](const QString& path) {
    restoreFromPng(path);
    tabs_->setCurrentWidget(paint_);
  });
  connect(gallery_, &GalleryView::reuseSeed, this, [this](quint64 seed) {
    paint_->reuseSeed(seed);
    tabs_->setCurrentWidget(paint_);
  });
  connect(gallery_, &GalleryView::sendToImg2img, this, [this](const QString& path) {
    paint_->setInitImage(path);
    tabs_->setCurrentWidget(paint_);
  });
  connect(bridge_, &bridge::EngineBridge::opened, this, [this](bool ok, bool executes, const QString& message) {
    if (!ok) engineLabel_->setText(tr("engine not available: %1").arg(message));
    else if (executes) engineLabel_->setText(tr("running the queue in %1").arg(options_.dataDir));
    else engineLabel_->setText(tr("another process runs the queue in %1; this window adds, follows and cancels its jobs").arg(options_.dataDir));
    engineLabel_->setToolTip(message);
    bridge_->scanModels();
  });
  connect(bridge_, &bridge::EngineBridge::errorOccurred, this, [this](const QString& m) { statusBar()->showMessage(m, 10000); });

  buildMenus();
  setupSnapshots();
  resize(1280, 820);
  // The workspaces get most of the height; the queue a strip below, the gallery a column.
  resizeDocks({queueDock_}, {190}, Qt::Vertical);
  resizeDocks({galleryDock_}, {260}, Qt::Horizontal);
  defaultState_ = QMainWindow::saveState();

  QSettings s;
  theme_ = s.value(QStringLiteral("studio/theme"), QStringLiteral("dark")).toString();
  applyTheme(theme_);
  setOutputFolder(s.value(QStringLiteral("studio/outputFolder"), QDir(options_.dataDir).filePath(QStringLiteral("outputs"))).toString());
  if (s.contains(QStringLiteral("studio/geometry"))) restoreGeometry(s.value(QStringLiteral("studio/geometry")).toByteArray());
  if (s.contains(QStringLiteral("studio/state"))) restoreState(s.value(QStringLiteral("studio/state")).toByteArray());
  // Switching workspaces puts the cursor in that workspace's prompt, ready to type.
  connect(tabs_, &QTabWidget::currentChanged, this, [this] {
    if (auto* prompt = tabs_->currentWidget()->findChild<QWidget*>(QStringLiteral("prompt"))) prompt->setFocus();
  });
  tabs_->setCurrentIndex(s.value(QStringLiteral("studio/tab"), 0).toInt());
  QTimer::singleShot(0, this, [this] { emit tabs_->currentChanged(tabs_->currentIndex()); });
  write_->loadSettings(s);
  paint_->loadSettings(s);
  bridge_->start();
}

StudioWindow::~StudioWindow() {
  // The workspaces and docks go first: Write flushes its conversations into the
  // store on the way out, and they all talk to the bridge (a child, deleted after).
  delete tabs_;
  delete queueDock_;
  delete galleryDock_;
  delete conversations_;
}

void StudioWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("&Settings..."), this, &StudioWindow::showSettings)->setObjectName(QStringLiteral("actionSettings"));
  file->addAction(tr("Open PNG &parameters..."), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Restore parameters from a PNG"), outputFolder_, tr("PNG (*.png)"));
    if (!path.isEmpty()) restoreFromPng(path);
  });
  file->addSeparator();
  file->addAction(tr("&Quit"), QKeySequence::Quit, this, &QWidget::close);

  QMenu* view = menuBar()->addMenu(tr("&View"));
  auto* writeAct = view->addAction(tr("Write"), QKeySequence(Qt::CTRL | Qt::Key_1), this, [this] { tabs_->setCurrentWidget(write_); });
  writeAct->setObjectName(QStringLiteral("actionWrite"));
  auto* paintAct = view->addAction(tr("Paint"), QKeySequence(Qt::CTRL | Qt::Key_2), this, [this] { tabs_->setCurrentWidget(paint_); });
  paintAct->setObjectName(QStringLiteral("actionPaint"));
  view->addSeparator();
  QAction* q = queueDock_->toggleViewAction();
  q->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Q));
  view->addAction(q);
  QAction* g = galleryDock_->toggleViewAction();
  g->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G));
  view->addAction(g);
  view->addSeparator();
  view->addAction(tr("&Reset layout"), this, &StudioWindow::resetLayout)->setObjectName(QStringLiteral("actionResetLayout"));
  auto* dark = view->addAction(tr("&Dark theme"));
  dark->setCheckable(true);
  dark->setChecked(theme_ == QLatin1String("dark"));
  connect(dark, &QAction::toggled, this, [this](bool on) { setTheme(on ? QStringLiteral("dark") : QStringLiteral("light")); });

  QMenu* queue = menuBar()->addMenu(tr("&Queue"));
  queue->addAction(tr("&Pause / resume"), this, [this] { bridge_->setPaused(!bridge_->paused()); });
  queue->addAction(tr("&Clear finished..."), queue_, [this] { queue_->clearFinished(true); });
}

// ATELIER_STUDIO_SHOTS=DIR: the window saves what it shows (Qt's grab) at
// the moments a review looks at: Write mid-stream, Paint mid-generation with
// a preview, Paint done with the gallery, and the queue. The end-to-end test
// and documentation screenshots use it.
void StudioWindow::setupSnapshots() {
  const QString dir = qEnvironmentVariable("ATELIER_STUDIO_SHOTS");
  if (dir.isEmpty()) return;
  QDir().mkpath(dir);
  auto shot = [this, dir](const QString& name, QWidget* what) {
    const QString path = QDir(dir).filePath(name);
    what->grab().save(path);
    statusBar()->showMessage(tr("snapshot %1").arg(path), 2000);
  };
  connect(bridge_, &bridge::EngineBridge::event, this, [this, shot](const Event& ev) {
    if (ev.type == EventType::Token && ev.job == write_->currentJob() && ev.index == 8 && !shotWrite_) {
      shotWrite_ = true;
      shot(QStringLiteral("write-midstream.png"), this);
    }
    if (ev.type == EventType::Preview && ev.image.steps > 2) steppedJobs_.insert(ev.job);
    if (ev.type == EventType::Preview && ev.image.steps > 2 && ev.image.step == ev.image.steps / 2 && !shotPaint_) {
      shotPaint_ = true;
      // After the canvas has painted this preview.
      QTimer::singleShot(50, this, [this, shot] { shot(QStringLiteral("paint-midgeneration.png"), this); });
    }
    if (ev.type == EventType::Completed && steppedJobs_.contains(ev.job)) {
      QTimer::singleShot(800, this, [this, shot] {
        shot(QStringLiteral("paint-done.png"), this);
        shot(QStringLiteral("queue.png"), queueDock_);
      });
    }
  });
}

void StudioWindow::resetLayout() {
  restoreState(defaultState_);
  queueDock_->show();
  galleryDock_->show();
}

void StudioWindow::setOutputFolder(const QString& folder) {
  outputFolder_ = folder;
  QDir().mkpath(folder);
  paint_->setOutputFolder(folder);
  gallery_->setFolder(folder);
}

void StudioWindow::setTheme(const QString& theme) {
  theme_ = theme;
  applyTheme(theme);
}

QString StudioWindow::engineStatus() const { return engineLabel_->text(); }

void StudioWindow::showSettings() {
  QDialog dialog(this);
  dialog.setObjectName(QStringLiteral("settingsDialog"));
  dialog.setWindowTitle(tr("Settings"));
  auto* form = new QFormLayout(&dialog);
  auto* theme = new QComboBox(&dialog);
  theme->addItem(tr("Dark"), QStringLiteral("dark"));
  theme->addItem(tr("Light"), QStringLiteral("light"));
  theme->setCurrentIndex(theme_ == QLatin1String("light") ? 1 : 0);
  theme->setToolTip(tr("The window's colours"));
  form->addRow(tr("Theme"), theme);
  auto* folder = new QLineEdit(outputFolder_, &dialog);
  folder->setToolTip(tr("Where Paint saves its PNGs (with their parameters inside)"));
  auto* browse = new QPushButton(tr("Browse..."), &dialog);
  auto* row = new QHBoxLayout;
  row->addWidget(folder, 1);
  row->addWidget(browse);
  form->addRow(tr("Output folder"), row);
  connect(browse, &QPushButton::clicked, &dialog, [&] {
    const QString d = QFileDialog::getExistingDirectory(&dialog, tr("Output folder"), folder->text());
    if (!d.isEmpty()) folder->setText(d);
  });
  auto* data = new QLabel(options_.dataDir, &dialog);
  data->setToolTip(tr("Queue, conversations and the model store (ATELIER_HOME)"));
  form->addRow(tr("Data folder"), data);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
  form->addRow(buttons);
  connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  if (dialog.exec() != QDialog::Accepted) return;
  setTheme(theme->currentData().toString());
  if (folder->text() != outputFolder_) setOutputFolder(folder->text());
  saveState();
}

void StudioWindow::saveState() {
  QSettings s;
  s.setValue(QStringLiteral("studio/geometry"), saveGeometry());
  s.setValue(QStringLiteral("studio/state"), QMainWindow::saveState());
  s.setValue(QStringLiteral("studio/tab"), tabs_->currentIndex());
  s.setValue(QStringLiteral("studio/theme"), theme_);
  s.setValue(QStringLiteral("studio/outputFolder"), outputFolder_);
  write_->saveSettings(s);
  paint_->saveSettings(s);
  s.sync();
}

void StudioWindow::closeEvent(QCloseEvent* event) {
  saveState();
  conversations_->flush();
  QMainWindow::closeEvent(event);
}

void StudioWindow::dragEnterEvent(QDragEnterEvent* event) {
  for (const QUrl& u : event->mimeData()->urls())
    if (u.isLocalFile() && u.toLocalFile().endsWith(QStringLiteral(".png"), Qt::CaseInsensitive)) {
      event->acceptProposedAction();
      return;
    }
}

void StudioWindow::dropEvent(QDropEvent* event) {
  for (const QUrl& u : event->mimeData()->urls())
    if (u.isLocalFile() && u.toLocalFile().endsWith(QStringLiteral(".png"), Qt::CaseInsensitive)) {
      restoreFromPng(u.toLocalFile());
      event->acceptProposedAction();
      return;
    }
}

void StudioWindow::restoreFromPng(const QString& path) {
  const QStringList missing = paint_->restoreFromPng(path);
  tabs_->setCurrentWidget(paint_);
  const QString name = QFileInfo(path).fileName();
  statusBar()->showMessage(missing.isEmpty() ? tr("Parameters restored from %1").arg(name)
                                             : tr("Parameters restored from %1; not restored: %2").arg(name, missing.join(QStringLiteral(", "))),
                           15000);
}

}  // namespace atelier::ui
