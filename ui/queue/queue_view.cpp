#include "queue/queue_view.h"

#include <QAction>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QMessageBox>
#include <QTableView>
#include <QToolBar>
#include <QVBoxLayout>

#include <set>

#include "queue/queue_model.h"

namespace atelier::ui {

QueueView::QueueView(bridge::EngineBridge* bridge, QWidget* parent) : QWidget(parent), bridge_(bridge) {
  setObjectName(QStringLiteral("queueView"));
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(2, 2, 2, 2);
  auto* bar = new QToolBar(this);
  bar->setObjectName(QStringLiteral("queueToolbar"));
  pause_ = bar->addAction(tr("Pause"));
  pause_->setObjectName(QStringLiteral("queuePause"));
  pause_->setCheckable(true);
  pause_->setToolTip(tr("Pause the queue: no new job starts; running ones finish"));
  auto* cancel = bar->addAction(tr("Cancel"), this, &QueueView::cancelSelected);
  cancel->setObjectName(QStringLiteral("queueCancel"));
  cancel->setToolTip(tr("Cancel the selected jobs (Delete)"));
  auto* retry = bar->addAction(tr("Retry"), this, &QueueView::retrySelected);
  retry->setObjectName(QStringLiteral("queueRetry"));
  retry->setToolTip(tr("Run the selected failed or cancelled jobs again, with the same request and seed"));
  auto* up = bar->addAction(tr("Priority +"), this, [this] { raisePriority(1); });
  up->setObjectName(QStringLiteral("queuePriorityUp"));
  up->setToolTip(tr("Raise the selected queued jobs' priority"));
  auto* down = bar->addAction(tr("Priority -"), this, [this] { raisePriority(-1); });
  down->setObjectName(QStringLiteral("queuePriorityDown"));
  down->setToolTip(tr("Lower the selected queued jobs' priority"));
  auto* clear = bar->addAction(tr("Clear finished"), this, [this] { clearFinished(true); });
  clear->setObjectName(QStringLiteral("queueClear"));
  clear->setToolTip(tr("Forget completed, failed and cancelled jobs (their files stay)"));
  layout->addWidget(bar);

  model_ = new QueueModel(bridge_, this);
  table_ = new QTableView(this);
  table_->setObjectName(QStringLiteral("queueTable"));
  table_->setModel(model_);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->setVisible(false);
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
  table_->horizontalHeader()->setStretchLastSection(false);
  table_->horizontalHeader()->setSectionResizeMode(QueueModel::Prompt, QHeaderView::Stretch);
  table_->setColumnWidth(QueueModel::Kind, 50);
  table_->setColumnWidth(QueueModel::Model, 150);
  table_->setColumnWidth(QueueModel::State, 95);
  table_->setColumnWidth(QueueModel::Progress, 70);
  table_->setColumnWidth(QueueModel::Priority, 60);
  table_->setColumnWidth(QueueModel::Created, 110);
  table_->setColumnWidth(QueueModel::Duration, 70);
  auto* del = new QAction(this);
  del->setShortcut(QKeySequence::Delete);
  del->setShortcutContext(Qt::WidgetShortcut);
  connect(del, &QAction::triggered, this, &QueueView::cancelSelected);
  table_->addAction(del);
  layout->addWidget(table_);

  connect(pause_, &QAction::toggled, this, [this](bool on) {
    if (on != bridge_->paused()) bridge_->setPaused(on);
    pause_->setText(on ? tr("Resume") : tr("Pause"));
  });
  connect(bridge_, &bridge::EngineBridge::pausedChanged, this, [this](bool on) {
    const QSignalBlocker b(pause_);
    pause_->setChecked(on);
    pause_->setText(on ? tr("Resume") : tr("Pause"));
  });
}

QVector<JobId> QueueView::selectedJobs() const {
  QVector<JobId> ids;
  std::set<int> rows;
  for (const QModelIndex& i : table_->selectionModel()->selectedIndexes()) rows.insert(i.row());
  for (int r : rows)
    if (const JobInfo* j = model_->job(r)) ids.push_back(j->id);
  return ids;
}

void QueueView::cancelSelected() {
  for (JobId id : selectedJobs()) {
    const int r = model_->rowOf(id);
    const JobInfo* j = model_->job(r);
    if (!j || (j->state != JobState::Queued && j->state != JobState::Running)) continue;
    if (j->state == JobState::Running) model_->markCancelling(id);
    bridge_->cancel(id, [this](Status s) {
      if (!s.ok()) emit statusMessage(QString::fromStdString(s.message));
    });
  }
}

void QueueView::retrySelected() {
  for (JobId id : selectedJobs()) {
    const JobInfo* j = model_->job(model_->rowOf(id));
    if (!j || (j->state != JobState::Failed && j->state != JobState::Cancelled)) continue;
    bridge_->retry(id, [this, id](Result<JobId> r) {
      emit statusMessage(r.ok() ? tr("Job %1 queued again as job %2").arg(id).arg(r.value())
                                : QString::fromStdString(r.status().message));
    });
  }
}

void QueueView::raisePriority(int delta) {
  for (JobId id : selectedJobs()) {
    const JobInfo* j = model_->job(model_->rowOf(id));
    if (!j || (j->state != JobState::Queued && j->state != JobState::Running)) continue;
    // Clicks faster than the job list refreshes build on the value asked for last.
    const int wanted = pendingPriority_.value(id, j->priority) + delta;
    pendingPriority_[id] = wanted;
    bridge_->setPriority(id, wanted, [this, id, wanted](Status s) {
      if (pendingPriority_.value(id) == wanted) pendingPriority_.remove(id);
      if (!s.ok()) emit statusMessage(QString::fromStdString(s.message));
    });
  }
}

void QueueView::clearFinished(bool confirm) {
  if (confirm && QMessageBox::question(this, tr("Clear finished jobs"),
                                       tr("Forget every completed, failed and cancelled job? Their images and texts on disk stay.")) !=
                     QMessageBox::Yes)
    return;
  bridge_->clearFinished([this](int n) { emit statusMessage(tr("%n finished job(s) cleared", nullptr, n)); });
}

}  // namespace atelier::ui
