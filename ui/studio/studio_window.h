// The studio's main window: Write and Paint as tabs, the queue and the
// gallery as docks (stable objectNames, toggled from View, layout kept in
// QSettings, "Reset layout"), the engine's mode in the status bar, and PNG
// drops anywhere restoring their parameters into Paint.
#pragma once

#include <QByteArray>
#include <QMainWindow>
#include <QSet>

#include "bridge/engine_bridge.h"

class QDockWidget;
class QLabel;
class QTabWidget;

namespace atelier::ui {

class ConversationStore;
class GalleryView;
class PaintTab;
class QueueView;
class WriteTab;

struct StudioOptions {
  QString dataDir;           // queue, conversations, default output folder ("" = the engine's default)
  QStringList modelFolders;  // loose model files for the pickers
  int threads = 0;
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
  QString outputFolder() const { return outputFolder_; }
  void setOutputFolder(const QString& folder);
  QString theme() const { return theme_; }
  void setTheme(const QString& theme);  // "dark" or "light"
  void resetLayout();
  void saveState();                     // settings and layout now (also on close)
  QString engineStatus() const;         // what the status bar says about the queue

  static void applyTheme(const QString& theme);

 protected:
  void closeEvent(QCloseEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void buildMenus();
  void setupSnapshots();
  void showSettings();
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
  QLabel* engineLabel_;
  QLabel* statsLabel_;
  QByteArray defaultState_;
  QString outputFolder_;
  QString theme_ = QStringLiteral("dark");
  bool shotWrite_ = false, shotPaint_ = false;
  QSet<atelier::JobId> steppedJobs_;  // image jobs with denoising steps (snapshots)
};

}  // namespace atelier::ui
