// The queue dock's contents: the job table and its actions (pause/resume,
// cancel, retry, priority up/down, clear finished).
#pragma once

#include <QHash>
#include <QWidget>

#include "bridge/engine_bridge.h"

class QAction;
class QTableView;

namespace atelier::ui {

class QueueModel;

class QueueView : public QWidget {
  Q_OBJECT

 public:
  explicit QueueView(bridge::EngineBridge* bridge, QWidget* parent = nullptr);
  QueueModel* model() const { return model_; }
  QTableView* table() const { return table_; }
  QSize sizeHint() const override { return {900, 190}; }  // a strip under the workspaces

 public slots:
  void cancelSelected();
  void retrySelected();
  void raisePriority(int delta);
  void clearFinished(bool confirm = true);

 signals:
  void statusMessage(const QString& text);

 private:
  QVector<atelier::JobId> selectedJobs() const;
  bridge::EngineBridge* bridge_;
  QueueModel* model_;
  QTableView* table_;
  QAction* pause_;
  QHash<atelier::JobId, int> pendingPriority_;  // asked for, not yet confirmed
};

}  // namespace atelier::ui
