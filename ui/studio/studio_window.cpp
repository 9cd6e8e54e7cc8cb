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
#include <QMessageBox>
#include <QMimeData>
#include <QPalette>
#include <QPushButton>
#include <QScreen>
#include <QSettings>
#include <QHeaderView>
#include <QKeySequence>
#include <QStackedWidget>
#include <QStatusBar>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QStyleFactory>
#include <QTabWidget>
#include <QTimer>
#include <QTreeWidget>

#include "common/model_picker.h"
#include "common/wheel_guard.h"
#include "gallery/gallery_view.h"
#include "history/history_view.h"
#include "models/models_window.h"
#include "monitor/engine_monitor.h"
#include "settings/settings_dialog.h"
#include "welcome/welcome_page.h"
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
  settings_ = StudioSettings::load();
  bridge_ = new bridge::EngineBridge(bridgeOptions(), this);
  store_ = new bridge::StoreWorker(bridge_->options().storeDir, this);
  conversations_ = new ConversationStore(options_.dataDir);

  tabs_ = new QTabWidget(this);
  tabs_->setObjectName(QStringLiteral("workspaces"));
  tabs_->setDocumentMode(true);
  write_ = new WriteTab(bridge_, conversations_, tabs_);
  paint_ = new PaintTab(bridge_, tabs_);
  tabs_->addTab(write_, tr("&Write"));
  tabs_->addTab(paint_, tr("&Paint"));
  stack_ = new QStackedWidget(this);
  stack_->setObjectName(QStringLiteral("centralStack"));
  stack_->addWidget(tabs_);
  setCentralWidget(stack_);

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
  history_ = new HistoryView(bridge_, this);
  historyDock_ = new QDockWidget(tr("History"), this);
  historyDock_->setObjectName(QStringLiteral("historyDock"));
  historyDock_->setWidget(history_);
  addDockWidget(Qt::BottomDockWidgetArea, historyDock_);
  tabifyDockWidget(queueDock_, historyDock_);
  queueDock_->raise();
  // The monitor floats beside the window until it is docked (polls and draws only while shown).
  monitorDock_ = new QDockWidget(tr("Engine monitor"), this);
  monitorDock_->setObjectName(QStringLiteral("monitorDock"));
  if (EngineMonitor::openGLAvailable()) {
    monitor_ = new EngineMonitor(bridge_, this);
    monitorDock_->setWidget(monitor_);
  } else {
    monitor_ = nullptr;
    auto* none = new QLabel(tr("The engine monitor draws with OpenGL, which this display does not offer "
                               "(`atelier metrics` prints the same figures)."), monitorDock_);
    none->setWordWrap(true);
    none->setObjectName(QStringLiteral("monitorUnavailable"));
    monitorDock_->setWidget(none);
  }
  addDockWidget(Qt::RightDockWidgetArea, monitorDock_);
  tabifyDockWidget(galleryDock_, monitorDock_);  // the whole right column when it is in front
  monitorDock_->hide();

  engineLabel_ = new QLabel(tr("opening the engine..."), this);
  engineLabel_->setObjectName(QStringLiteral("engineStatus"));
  statsLabel_ = new QLabel(this);
  statsLabel_->setObjectName(QStringLiteral("writeStats"));
  // Room for the longest figures, so the label does not jump or clip while tokens stream.
  statsLabel_->setMinimumWidth(statsLabel_->fontMetrics().horizontalAdvance(QStringLiteral("9999.9 tokens/s · 9999 tokens · context 9999/9999")));
  statsLabel_->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  apiLabel_ = new QLabel(this);
  apiLabel_->setObjectName(QStringLiteral("apiStatus"));
  apiLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  apiLabel_->hide();
  statusBar()->addPermanentWidget(statsLabel_);
  statusBar()->addPermanentWidget(apiLabel_);
  statusBar()->addPermanentWidget(engineLabel_);

  connect(write_, &WriteTab::statsChanged, statsLabel_, &QLabel::setText);
  connect(write_, &WriteTab::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(paint_, &PaintTab::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(queue_, &QueueView::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(gallery_, &GalleryView::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(paint_, &PaintTab::imagesSaved, gallery_, &GalleryView::addImages);
  connect(history_, &HistoryView::statusMessage, this, [this](const QString& m) { statusBar()->showMessage(m, 8000); });
  connect(history_, &HistoryView::reopenText, this, [this](const JobInfo& j) {
    if (!write_->openRequest(j.request, j.seed)) {
      statusBar()->showMessage(tr("Write is busy; stop its generation first"), 8000);
      return;
    }
    tabs_->setCurrentWidget(write_);
  });
  connect(history_, &HistoryView::reopenImage, this, [this](const JobInfo& j) {
    for (const std::string& f : j.files)
      if (QFileInfo::exists(QString::fromStdString(f))) {
        restoreFromPng(QString::fromStdString(f));
        return;
      }
    statusBar()->showMessage(tr("Job #%1's images are gone; its parameters are in the History details").arg(j.id), 10000);
  });
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
    if (!ok) engineText_ = tr("engine not available: %1").arg(message);
    else if (executes) engineText_ = tr("running the queue in %1 on %2").arg(options_.dataDir, deviceName_);
    else engineText_ = tr("another process runs the queue in %1; this window adds, follows and cancels its jobs").arg(options_.dataDir);
    showEngineState();
    engineLabel_->setToolTip(executes && ok ? deviceWhy_ : message);
    bridge_->scanModels();
  });
  connect(bridge_, &bridge::EngineBridge::deviceChosen, this, [this](const QString& name, const QString& why) {
    deviceName_ = name;
    deviceWhy_ = why;
  });
  connect(bridge_, &bridge::EngineBridge::errorOccurred, this, [this](const QString& m) { statusBar()->showMessage(m, 10000); });
  // The local API (Settings > API server): its address in the status bar while it listens.
  connect(bridge_, &bridge::EngineBridge::apiServerChanged, this, [this](bool running, const QString& address, const QString& error) {
    apiAddress_ = address;
    apiLabel_->setText(running ? tr("API %1").arg(address) : QString());
    apiLabel_->setVisible(running);
    if (!error.isEmpty()) statusBar()->showMessage(error, 15000);
  });

  // A paused queue runs nothing: the status bar says so plainly, not "running the queue".
  connect(bridge_, &bridge::EngineBridge::pausedChanged, this, &StudioWindow::showEngineState);
  // The text figures (tokens/s, context) are Write's: not shown while Paint is in front.
  connect(tabs_, &QTabWidget::currentChanged, this, [this] { statsLabel_->setVisible(tabs_->currentWidget() == write_); });
  guardWheel(this);
  // History in the bottom strip shows a few rows, not one and a half (the strip's height is the
  // layout's to choose; this is its floor).
  history_->setMinimumHeight(history_->fontMetrics().lineSpacing() * 12);

  buildMenus();
  setupSnapshots();
  // The default size, within the screen's free area (a 1366x768 laptop, or 200 % scaling, has less than 820 px).
  const QSize room = screen() ? screen()->availableGeometry().size() : QSize(1280, 820);
  resize(std::min(1280, room.width()), std::min(820, room.height()));
  // The workspaces get most of the height; the queue (and History, tabbed with it) a strip below
  // tall enough for several rows under its tabs and buttons, the gallery a column.
  resizeDocks({queueDock_}, {220}, Qt::Vertical);
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
  paint_->setPreviewDecoder(settings_.previewDecoder);
  paint_->setPreviewEvery(settings_.previewEverySteps);
  paint_->setFileNaming(settings_.fileNaming);
  for (const QString& kind : {QStringLiteral("text"), QStringLiteral("image")}) {
    const QString pinned = s.value(QStringLiteral("models/pinned/%1").arg(kind)).toString();
    if (pinned.isEmpty()) continue;
    if (auto* picker = findChild<ModelPicker*>(kind == QLatin1String("text") ? QStringLiteral("writeModel") : QStringLiteral("imageModel")))
      picker->setPreferred(pinned);
  }
  bridge_->setApiServer(settings_.apiEnabled, settings_.apiAddress, settings_.apiKey);  // applied once the engine opens
  bridge_->start();
  if (options_.welcome) showWelcomeIfEmpty();
  if (!options_.openPng.isEmpty()) restoreFromPng(options_.openPng);  // after the saved panel values, which it replaces
}

bridge::EngineBridge::Options StudioWindow::bridgeOptions() const {
  bridge::EngineBridge::Options bo;
  bo.dataDir = options_.dataDir;
  bo.storeDir = settings_.storeDir;
  bo.modelFolders = options_.modelFolders;
  bo.threads = options_.threads ? options_.threads : settings_.threads;
  bo.maxBatch = settings_.maxBatch;
  bo.maxWaitMs = settings_.maxWaitMs;
  bo.kvMemoryBytes = int64_t{settings_.kvMemoryMiB} << 20;
  bo.modelCacheBytes = int64_t{settings_.modelMemoryMiB} << 20;
  kv_type_from_name(settings_.kvType.toStdString(), &bo.kvType);  // an unknown name keeps F16
  bo.device = settings_.device.toStdString();
  return bo;
}

void StudioWindow::showWelcomeIfEmpty() {
  store_->list(bridge::while_alive(this, [this](Result<std::vector<StoreModel>> r) {
    if (!r.ok() || !r.value().empty() || welcome_) return;
    welcome_ = new WelcomePage(store_, stack_);
    stack_->addWidget(welcome_);
    stack_->setCurrentWidget(welcome_);
    connect(welcome_, &WelcomePage::installed, this, [this] {
      // Write starts on the text model just installed (not a loose file listed before it);
      // Paint on the image model unless it already has one.
      if (auto* text = findChild<ModelPicker*>(QStringLiteral("writeModel"))) text->setPreferred(WelcomePage::defaultModels().at(0));
      if (auto* image = findChild<ModelPicker*>(QStringLiteral("imageModel")); image && image->reference().isEmpty())
        image->setPreferred(WelcomePage::defaultModels().at(1));
      leaveWelcome();
    });
    connect(welcome_, &WelcomePage::skipped, this, &StudioWindow::leaveWelcome);
    if (auto* b = welcome_->findChild<QWidget*>(QStringLiteral("installButton"))) b->setFocus();
  }));
}

bool StudioWindow::showingWelcome() const { return welcome_ && stack_->currentWidget() == welcome_; }

void StudioWindow::leaveWelcome() {
  stack_->setCurrentWidget(tabs_);
  tabs_->setCurrentWidget(write_);
  // The page's buttons had the focus: it goes to Write's prompt, ready to type.
  if (auto* prompt = write_->findChild<QWidget*>(QStringLiteral("prompt"))) prompt->setFocus();
  bridge_->scanModels();
  if (models_) models_->refresh();
}

ModelsWindow* StudioWindow::modelsWindow() {
  if (!models_) {
    models_ = new ModelsWindow(store_, bridge_, this);
    models_->setWindowFlag(Qt::Window);
    emit modelsWindowCreated();
    connect(models_, &ModelsWindow::storeChanged, bridge_, &bridge::EngineBridge::scanModels);
    connect(models_, &ModelsWindow::pinned, this, [this](const QString& kind, const QString& ref) {
      if (auto* picker = findChild<ModelPicker*>(kind == QLatin1String("text") ? QStringLiteral("writeModel") : QStringLiteral("imageModel")))
        picker->setPreferred(ref);
    });
  }
  return models_;
}

void StudioWindow::showModels() {
  ModelsWindow* m = modelsWindow();
  m->show();
  m->raise();
  m->activateWindow();
}

void StudioWindow::restartEngine() {
  engineLabel_->setText(tr("restarting the engine..."));
  bridge_->restart(bridgeOptions());
}

void StudioWindow::applySettings(const StudioSettings& next, bool restart) {
  const bool engineChanged = settings_.needsRestart(next);
  const StudioSettings previous = settings_;
  settings_ = next;
  settings_.save();
  setTheme(next.theme);
  if (!next.outputFolder.isEmpty() && next.outputFolder != outputFolder_) setOutputFolder(next.outputFolder);
  paint_->setPreviewDecoder(next.previewDecoder);
  paint_->setPreviewEvery(next.previewEverySteps);
  paint_->setFileNaming(next.fileNaming);
  if (next.apiEnabled != previous.apiEnabled || next.apiAddress != previous.apiAddress || next.apiKey != previous.apiKey)
    bridge_->setApiServer(next.apiEnabled, next.apiAddress, next.apiKey);
  if (engineChanged && restart) restartEngine();
  else if (engineChanged) statusBar()->showMessage(tr("The engine settings take effect after a restart (File > Restart the engine)"), 15000);
  saveState();
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
  file->addAction(tr("&Settings..."), QKeySequence(Qt::CTRL | Qt::Key_Comma), this, &StudioWindow::showSettings)
      ->setObjectName(QStringLiteral("actionSettings"));
  file->addAction(tr("Restart the &engine"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R), this, &StudioWindow::restartEngine)
      ->setObjectName(QStringLiteral("actionRestartEngine"));
  file->addAction(tr("Open PNG &parameters..."), QKeySequence(Qt::CTRL | Qt::Key_O), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Restore parameters from a PNG"), outputFolder_, tr("PNG (*.png)"));
    if (!path.isEmpty()) restoreFromPng(path);
  });
  file->addSeparator();
  file->addAction(tr("&Quit"), QKeySequence(Qt::CTRL | Qt::Key_Q), this, &QWidget::close);

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
  // History and the monitor share their dock area with a neighbour (tabs):
  // their actions bring them to the front rather than toggle them away.
  auto front = [](QDockWidget* dock) {
    dock->show();
    dock->raise();
  };
  QAction* h = view->addAction(tr("&History"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_H), this, [this, front] { front(historyDock_); });
  h->setObjectName(QStringLiteral("actionHistory"));
  QAction* mon = view->addAction(tr("&Engine monitor"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_E), this, [this, front] { front(monitorDock_); });
  mon->setObjectName(QStringLiteral("actionMonitor"));
  view->addSeparator();
  view->addAction(tr("&Reset layout"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_L), this, &StudioWindow::resetLayout)
      ->setObjectName(QStringLiteral("actionResetLayout"));
  auto* dark = view->addAction(tr("&Dark theme"));
  dark->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_T));
  dark->setCheckable(true);
  dark->setChecked(theme_ == QLatin1String("dark"));
  connect(dark, &QAction::toggled, this, [this](bool on) { setTheme(on ? QStringLiteral("dark") : QStringLiteral("light")); });

  QMenu* queue = menuBar()->addMenu(tr("&Queue"));
  queue->addAction(tr("&Pause / resume"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_P), this, [this] { bridge_->setPaused(!bridge_->paused()); });
  queue->addAction(tr("&Clear finished..."), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_K), queue_, [this] { queue_->clearFinished(true); });

  QMenu* models = menuBar()->addMenu(tr("&Models"));
  models->addAction(tr("&Manage models..."), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M), this, &StudioWindow::showModels)
      ->setObjectName(QStringLiteral("actionModels"));
  models->addAction(tr("&Install from the catalog..."), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_I), this, [this] {
    showModels();
    models_->showPull();
  });
  models->addAction(tr("Import a model &file..."), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_O), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Import a model"), QString(),
                                                      tr("Models (*.gguf *.safetensors *.ckpt *.pth *.pt *.bin);;All files (*)"));
    if (path.isEmpty()) return;
    showModels();
    models_->importFile(path);
  });

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  help->addAction(tr("&Keyboard shortcuts"), QKeySequence(Qt::Key_F1), this, &StudioWindow::showShortcuts)
      ->setObjectName(QStringLiteral("actionShortcuts"));
  help->addAction(tr("&Documentation"), QKeySequence(Qt::SHIFT | Qt::Key_F1), this, [this] {
    QMessageBox::information(
        this, tr("Atelier documentation"),
        tr("<p><b>Write</b>: chat with a text model or let it continue a document (Notebook). Each chat has its own context "
           "size and overflow policy (left panel).</p><p><b>Paint</b>: images from a prompt; every step is previewed.</p>"
           "<p><b>Queue</b>, <b>Gallery</b>, <b>History</b> and the <b>Engine monitor</b> are docks (View menu).</p>"
           "<p>Esc stops a generation whatever has focus; Help &gt; Keyboard shortcuts lists every key.</p>"
           "<p>Everything the studio does, the command line does too: run <code>atelier --help</code>; the project's "
           "README.md documents every command, flag and the HTTP API.</p>"));
  })->setObjectName(QStringLiteral("actionDocumentation"));
  help->addAction(tr("&About Atelier"), QKeySequence(Qt::CTRL | Qt::Key_F1), this, [this] {
    QMessageBox::about(this, tr("About Atelier"),
                       tr("<p><b>Atelier Studio</b></p><p>Text and images generated on this machine: a durable job queue, "
                          "a versioned model store and a local HTTP API.</p><p>Qt %1</p>")
                           .arg(QString::fromLatin1(qVersion())));
  })->setObjectName(QStringLiteral("actionAbout"));
}

// Every menu action with its shortcut, read from the menus themselves (so
// the list cannot fall behind them), plus the workspaces' own keys.
void StudioWindow::showShortcuts() {
  auto* dialog = new QDialog(this);
  dialog->setObjectName(QStringLiteral("shortcutsDialog"));
  dialog->setWindowTitle(tr("Keyboard shortcuts"));
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  auto* table = new QTableWidget(0, 3, dialog);
  table->setObjectName(QStringLiteral("shortcutsTable"));
  table->setHorizontalHeaderLabels({tr("Menu"), tr("Action"), tr("Shortcut")});
  table->verticalHeader()->hide();
  table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  auto add = [table](const QString& menu, const QString& action, const QString& keys) {
    const int r = table->rowCount();
    table->insertRow(r);
    table->setItem(r, 0, new QTableWidgetItem(menu));
    table->setItem(r, 1, new QTableWidgetItem(action));
    table->setItem(r, 2, new QTableWidgetItem(keys));
  };
  for (QAction* top : menuBar()->actions()) {
    QMenu* menu = top->menu();
    if (!menu) continue;
    for (QAction* a : menu->actions()) {
      if (a->isSeparator()) continue;
      add(top->text().remove('&'), a->text().remove('&'), a->shortcut().toString(QKeySequence::NativeText));
    }
  }
  add(tr("Write / Paint"), tr("Generate now"), QKeySequence(Qt::CTRL | Qt::Key_Return).toString(QKeySequence::NativeText));
  add(tr("Write"), tr("Add to the queue"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Return).toString(QKeySequence::NativeText));
  add(tr("Write / Paint"), tr("Stop (whatever has focus)"), QKeySequence(Qt::Key_Escape).toString(QKeySequence::NativeText));
  add(tr("Write"), tr("Previous / next prompt"), tr("Ctrl+Up / Ctrl+Down"));
  add(tr("Write"), tr("Regenerate the last answer"), QKeySequence(Qt::CTRL | Qt::Key_R).toString(QKeySequence::NativeText));
  auto* layout = new QVBoxLayout(dialog);
  layout->addWidget(table);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, dialog);
  connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
  layout->addWidget(buttons);
  dialog->resize(560, 520);
  dialog->open();
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
  // The History dock when it is first shown (after its rows are filled), the
  // monitor once it has plotted a few seconds of work, the Models window once
  // its list arrived.
  connect(historyDock_, &QDockWidget::visibilityChanged, this, [this, shot](bool visible) {
    if (!visible || shotHistory_) return;
    shotHistory_ = true;
    // Room for rows and the details of the newest job, as a reviewer would open it.
    resizeDocks({historyDock_}, {380}, Qt::Vertical);
    QTimer::singleShot(300, this, [this] {
      const QVector<JobId> rows = history_->shownJobs();
      if (!rows.isEmpty()) history_->selectJob(rows.first());
    });
    QTimer::singleShot(900, this, [this, shot] { shot(QStringLiteral("history.png"), historyDock_); });
  });
  if (monitor_) connect(monitor_, &EngineMonitor::sampled, this, [this, shot] {
    if (shotMonitor_ || monitor_->data().samples().size() < 16) return;
    const MonitorSample& s = monitor_->data().samples().back();
    if (s.running == 0 && s.queued_text + s.queued_image == 0) return;  // while work runs
    shotMonitor_ = true;
    shot(QStringLiteral("monitor.png"), monitorDock_);
  });
  connect(this, &StudioWindow::modelsWindowCreated, this, [this, shot] {
    connect(models_, &ModelsWindow::listed, this, [this, shot] {
      if (shotModels_) return;
      shotModels_ = true;
      QTimer::singleShot(300, this, [this, shot] {
        models_->tree()->setCurrentItem(models_->tree()->topLevelItemCount() ? models_->tree()->topLevelItem(0)->child(0) : nullptr);
        QTimer::singleShot(400, this, [this, shot] { shot(QStringLiteral("models.png"), models_); });
      });
    });
  });
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

void StudioWindow::showEngineState() {
  const bool paused = bridge_->paused();
  engineLabel_->setText(paused ? tr("queue paused: nothing new starts (Queue > Pause / resume, Ctrl+Shift+P)") : engineText_);
  engineLabel_->setStyleSheet(paused ? QStringLiteral("color: #e0a040; font-weight: bold") : QString());
}
QString StudioWindow::apiAddress() const { return apiAddress_; }

void StudioWindow::showSettings() {
  StudioSettings current = settings_;
  current.theme = theme_;
  current.outputFolder = outputFolder_;
  auto* dialog = new SettingsDialog(current, /*apiServerAvailable=*/true, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  // An empty field means the data folder: say which one, rather than leave it blank.
  if (auto* store = dialog->findChild<QLineEdit*>(QStringLiteral("storeEdit")))
    store->setPlaceholderText(tr("the data folder: %1").arg(bridge_->options().storeDir.isEmpty() ? options_.dataDir : bridge_->options().storeDir));
  connect(dialog, &QDialog::accepted, this, [this, dialog] { applySettings(dialog->settings(), dialog->restartRequested()); });
  dialog->open();
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
