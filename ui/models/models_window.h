// The Models window over the store: every model and its versions with what
// their headers say, and the store's actions (verify with progress, promote,
// roll back, pin for new jobs, remove — refused while a queued job needs the
// version —, history), import by drop or file dialog (the header shown before
// the import is confirmed; hashing with a progress bar that can be
// cancelled), install from the catalog, and whether a version fits this
// machine's memory. Every store call runs on a StoreWorker thread.
#pragma once

#include <QWidget>

#include "bridge/engine_bridge.h"
#include "bridge/store_worker.h"

class QComboBox;
class QDialog;
class QLabel;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QTreeWidget;
class QTreeWidgetItem;

namespace atelier::ui {

class ModelsWindow : public QWidget {
  Q_OBJECT

 public:
  // BRIDGE (may be null) tells which jobs still need a version.
  ModelsWindow(bridge::StoreWorker* store, bridge::EngineBridge* engine, QWidget* parent = nullptr);

  QTreeWidget* tree() const { return tree_; }
  QString selectedReference() const;  // "name@N" of the selected version ("" = none)
  bool select(const QString& reference);
  QString message() const;             // what the last action said
  QString fitText() const;
  bool busy() const;

 public slots:
  void refresh();
  void importFile(const QString& path);  // reads the header, then asks (importDialog) before importing
  void showPull();                      // the catalog, a mirror folder, install
  void verifySelected();
  void promoteSelected();
  void rollbackSelected();
  void pinSelected();
  void removeSelected();
  void showHistory();
  void cancelTask();
  // A catalog install in progress pauses (its downloads kept, also across a
  // restart of the studio: QSettings models/pausedPull); Resume installs the
  // same models again, the downloads going on from where they stopped.
  void pausePull();
  void resumePull();

 signals:
  void pinned(const QString& kind, const QString& reference);  // new jobs of this kind use it
  void storeChanged();
  void listed();  // the tree was refilled

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void fill(const std::vector<atelier::StoreModel>& models);
  void say(const QString& text, bool error = false);
  void startTask(const QString& what);
  void startPull(const QStringList& names, const QString& mirror);
  void endTask();
  void updateButtons();
  void updateFit();
  QString selectedName() const;
  QString selectedKind() const;

  bridge::StoreWorker* store_;
  bridge::EngineBridge* engine_;
  QTreeWidget* tree_;
  QPushButton *verify_, *promote_, *rollback_, *pin_, *remove_, *history_, *import_, *pull_, *cancel_, *pause_;
  bool pulling_ = false, pausing_ = false;
  QComboBox* channel_;
  QProgressBar* progress_;
  QLabel* progressLabel_;
  QLabel* message_;
  QLabel* fit_;
  QPlainTextEdit* historyView_;
  bool taskRunning_ = false;
};

}  // namespace atelier::ui
