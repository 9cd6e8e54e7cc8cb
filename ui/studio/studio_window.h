// The studio's main window: Write and Paint as tabs, the queue and the
// gallery as docks (stable objectNames, toggled from View, layout kept in
// QSettings, "Reset layout"), the engine's mode in the status bar, and PNG
// drops anywhere restoring their parameters into Paint.
#pragma once

#include <QByteArray>
#include <QMainWindow>
#include <QSet>

#include "bridge/engine_bridge.h"
#include "bridge/store_worker.h"
#include "settings/studio_settings.h"

class QDockWidget;
class QLabel;
class QStackedWidget;
class QTabWidget;

namespace atelier::ui {

class ConversationStore;
class EngineMonitor;
class GalleryView;
class HistoryView;
class ModelsWindow;
class PaintTab;
class WelcomePage;
class QueueView;
class WriteTab;

struct StudioOptions {
  QString dataDir;           // queue, conversations, default output folder ("" = the engine's default)
  QStringList modelFolders;  // loose model files for the pickers
  int threads = 0;
  bool welcome = true;       // an empty store opens on the first-start page
  QString openPng;           // a PNG whose parameters Paint restores at start (the desktop entry's file)
};

class StudioWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit StudioWindow(StudioOptions options, QWidget* parent = nullptr);
  ~StudioWindow() override;

  bridge::EngineBridge* bridge() const { return bridge_; }
  WriteTab* writeTab() const { return write_; }
  PaintTab* paintTab() const { return paint_; }
  GalleryView* gallery() const { return gallery_; }
  QueueView* queueView() const { return queue_; }
  QTabWidget* tabs() const { return tabs_; }
  bridge::StoreWorker* storeWorker() const { return store_; }
  ModelsWindow* modelsWindow();         // created on first use
  HistoryView* historyView() const { return history_; }
  EngineMonitor* monitor() const { return monitor_; }
  QDockWidget* monitorDock() const { return monitorDock_; }
  QDockWidget* galleryDock() const { return galleryDock_; }
  WelcomePage* welcomePage() const { return welcome_; }
  bool showingWelcome() const;
  StudioSettings settings() const { return settings_; }
  // Keeps NEXT in QSettings and applies it (Paint, folders, theme at once;
  // the engine's settings when RESTART, by opening the engine again).
  void applySettings(const StudioSettings& next, bool restart);
  void restartEngine();
  void showModels();
  void showShortcuts();
  QString outputFolder() const { return outputFolder_; }
  void setOutputFolder(const QString& folder);
  QString theme() const { return theme_; }
  void setTheme(const QString& theme);  // "dark" or "light"
  void resetLayout();
  void saveState();                     // settings and layout now (also on close)
  QString engineStatus() const;
  void showEngineState();               // the engine's text, or that the queue is paused         // what the status bar says about the queue
  QString apiAddress() const;           // "http://HOST:PORT" while the API server listens, else ""

  static void applyTheme(const QString& theme);

 signals:
  void modelsWindowCreated();

 protected:
  void closeEvent(QCloseEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void buildMenus();
  void setupSnapshots();
  void showSettings();
  void showWelcomeIfEmpty();
  void leaveWelcome();
  bridge::EngineBridge::Options bridgeOptions() const;
  void restoreFromPng(const QString& path);

  StudioOptions options_;
  bridge::EngineBridge* bridge_;
  ConversationStore* conversations_;
  QTabWidget* tabs_;
  WriteTab* write_;
  PaintTab* paint_;
  GalleryView* gallery_;
  QueueView* queue_;
  QDockWidget* queueDock_;
  QDockWidget* galleryDock_;
  QDockWidget* historyDock_;
  QDockWidget* monitorDock_;
  EngineMonitor* monitor_;
  HistoryView* history_;
  bridge::StoreWorker* store_;
  ModelsWindow* models_ = nullptr;
  WelcomePage* welcome_ = nullptr;
  QStackedWidget* stack_;
  StudioSettings settings_;
  QLabel* engineLabel_;
  QString engineText_;  // what the engine is doing, shown when the queue is not paused
  QString deviceName_ = QStringLiteral("cpu"), deviceWhy_;  // where it runs, and why (EngineBridge::deviceChosen)
  QLabel* apiLabel_;
  QString apiAddress_;
  QLabel* statsLabel_;
  QByteArray defaultState_;
  QString outputFolder_;
  QString theme_ = QStringLiteral("dark");
  bool shotWrite_ = false, shotPaint_ = false, shotHistory_ = false, shotMonitor_ = false, shotModels_ = false;
  QSet<atelier::JobId> steppedJobs_;  // image jobs with denoising steps (snapshots)
};

}  // namespace atelier::ui
