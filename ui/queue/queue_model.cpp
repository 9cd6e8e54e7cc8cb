#include "queue/queue_model.h"

#include <QDateTime>
#include <QLocale>

#include <algorithm>

namespace atelier::ui {

QueueModel::QueueModel(bridge::EngineBridge* bridge, QObject* parent) : QAbstractTableModel(parent) {
  connect(bridge, &bridge::EngineBridge::jobsChanged, this, &QueueModel::apply);
  connect(bridge, &bridge::EngineBridge::event, this, &QueueModel::onEvent);
  apply(bridge->jobs(), {});
}

int QueueModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }
int QueueModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

const JobInfo* QueueModel::job(int row) const { return row >= 0 && row < rows_.size() ? &rows_[row] : nullptr; }

int QueueModel::rowOf(JobId id) const {
  // Rows are sorted by id, descending.
  auto it = std::lower_bound(rows_.begin(), rows_.end(), id, [](const JobInfo& j, JobId v) { return j.id > v; });
  return it != rows_.end() && it->id == id ? static_cast<int>(it - rows_.begin()) : -1;
}

void QueueModel::markCancelling(JobId id) {
  cancelling_.insert(id);
  if (int r = rowOf(id); r >= 0) emit dataChanged(index(r, State), index(r, State));
}

void QueueModel::apply(const QVector<JobInfo>& changed, const QVector<JobId>& removed) {
  for (JobId id : removed) {
    const int r = rowOf(id);
    if (r < 0) continue;
    beginRemoveRows({}, r, r);
    rows_.remove(r);
    endRemoveRows();
    progress_.remove(id);
    cancelling_.remove(id);
  }
  for (const JobInfo& j : changed) {
    const int r = rowOf(j.id);
    if (r >= 0) {
      rows_[r] = j;
      if (j.state != JobState::Queued && j.state != JobState::Running) cancelling_.remove(j.id);
      emit dataChanged(index(r, 0), index(r, ColumnCount - 1));
      continue;
    }
    auto it = std::lower_bound(rows_.begin(), rows_.end(), j.id, [](const JobInfo& a, JobId v) { return a.id > v; });
    const int at = static_cast<int>(it - rows_.begin());
    beginInsertRows({}, at, at);
    rows_.insert(at, j);
    endInsertRows();
  }
}

void QueueModel::onEvent(const Event& ev) {
  const int r = rowOf(ev.job);
  if (r < 0) return;
  double p = -1;
  if (ev.type == EventType::Progress) p = ev.progress;
  else if (ev.type == EventType::Preview && ev.image.steps > 0)
    p = (ev.image.image * ev.image.steps + ev.image.step) / double(std::max(1, ev.image.images * ev.image.steps));
  else if (ev.type == EventType::Token && rows_[r].kind == "text" && rows_[r].request.max_new_tokens > 0)
    p = (ev.index + 1) / double(rows_[r].request.max_new_tokens);
  if (p < 0) return;
  progress_[ev.job] = std::clamp(p, 0.0, 1.0);
  emit dataChanged(index(r, Progress), index(r, Progress));
}

QVariant QueueModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rows_.size()) return {};
  const JobInfo& j = rows_[index.row()];
  const bool image = j.kind == "image";
  if (role == JobIdRole) return QVariant::fromValue<qlonglong>(j.id);
  if (role == JobStateRole) return static_cast<int>(j.state);
  if (role == Qt::ToolTipRole) {
    QString tip = QString::fromStdString(image ? j.image_request.prompt : j.request.prompt).left(600);
    if (!j.error.empty()) tip += QStringLiteral("\n\n") + QString::fromStdString(j.error);
    tip += QStringLiteral("\n%1 %2").arg(QString::fromStdString(!j.model_name.empty() ? j.model_name : image ? j.image_request.model : j.request.model), QString::fromStdString(j.model_version));
    return tip;
  }
  if (role == Qt::TextAlignmentRole && (index.column() == Priority || index.column() == Progress || index.column() == Duration))
    return int(Qt::AlignRight | Qt::AlignVCenter);
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case Kind: return image ? tr("image") : tr("text");
    case Prompt: return QString::fromStdString(image ? j.image_request.prompt : j.request.prompt).simplified().left(120);
    case Model: {
      // A store version by name@version; a plain file by its file name (the tooltip has the digest).
      const QString m = QString::fromStdString(!j.model_name.empty() ? j.model_name : image ? j.image_request.model : j.request.model);
      return m.contains('/') ? m.section('/', -1) : m;
    }
    case State:
      if (cancelling_.contains(j.id) && (j.state == JobState::Queued || j.state == JobState::Running)) return tr("cancelling...");
      return QString::fromLatin1(job_state_name(j.state).data(), static_cast<int>(job_state_name(j.state).size()));
    case Progress: {
      if (j.state == JobState::Completed) return QStringLiteral("100%");
      if (j.state == JobState::Queued) return QString();
      double p = progress_.value(j.id, -1);
      if (p < 0 && !image && j.request.max_new_tokens > 0) p = j.stats.new_tokens / double(j.request.max_new_tokens);
      return p < 0 ? QString() : QStringLiteral("%1%").arg(int(p * 100));
    }
    case Priority: return j.priority;
    case Created: return j.created_ms ? QLocale().toString(QDateTime::fromMSecsSinceEpoch(j.created_ms), QStringLiteral("MM-dd HH:mm:ss")) : QString();
    case Duration: {
      if (!j.started_ms) return QString();
      const int64_t end = j.finished_ms ? j.finished_ms : QDateTime::currentMSecsSinceEpoch();
      return QStringLiteral("%1 s").arg((end - j.started_ms) / 1000.0, 0, 'f', 1);
    }
  }
  return {};
}

QVariant QueueModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* names[] = {"Kind", "Prompt", "Model", "State", "Progress", "Priority", "Created", "Duration"};
  return section >= 0 && section < ColumnCount ? tr(names[section]) : QVariant();
}

}  // namespace atelier::ui
