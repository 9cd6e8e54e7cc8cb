// The job database as a table: text and image jobs together, newest first,
// updated row by row from the bridge's job list changes and progress events
// (no reset per event).
#pragma once

#include <QAbstractTableModel>
#include <QHash>
#include <QSet>
#include <QVector>

#include "bridge/engine_bridge.h"

namespace atelier::ui {

class QueueModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { Kind, Prompt, Model, State, Progress, Priority, Created, Duration, ColumnCount };
  static constexpr int JobIdRole = Qt::UserRole + 1;
  static constexpr int JobStateRole = Qt::UserRole + 2;

  explicit QueueModel(bridge::EngineBridge* bridge, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

  const atelier::JobInfo* job(int row) const;
  int rowOf(atelier::JobId id) const;
  void markCancelling(atelier::JobId id);  // shows "cancelling..." until the engine confirms

 private:
  void apply(const QVector<atelier::JobInfo>& changed, const QVector<atelier::JobId>& removed);
  void onEvent(const atelier::Event& event);
  QVector<atelier::JobInfo> rows_;         // newest (highest id) first
  QHash<atelier::JobId, double> progress_;  // live, from events
  QSet<atelier::JobId> cancelling_;
};

}  // namespace atelier::ui
