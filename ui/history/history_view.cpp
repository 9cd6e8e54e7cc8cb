#include "history/history_view.h"

#include <QComboBox>
#include <QDateTime>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QTextBrowser>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>

namespace atelier::ui {

namespace {
enum Column { Finished, Kind, State, Model, Prompt, Seed, ColumnCount };

bool finishedState(JobState s) { return s == JobState::Completed || s == JobState::Failed || s == JobState::Cancelled; }

QString promptOf(const JobInfo& j) {
  return QString::fromStdString(j.kind == "image" ? j.image_request.prompt : j.request.prompt);
}
QString modelOf(const JobInfo& j) {
  return QString::fromStdString(!j.model_name.empty() ? j.model_name : j.kind == "image" ? j.image_request.model : j.request.model);
}
}  // namespace

HistoryView::HistoryView(bridge::EngineBridge* bridge, QWidget* parent) : QWidget(parent), bridge_(bridge) {
  setObjectName(QStringLiteral("historyView"));
  setWindowTitle(tr("History"));
  search_ = new QLineEdit(this);
  search_->setObjectName(QStringLiteral("historySearch"));
  search_->setPlaceholderText(tr("Search prompts and models"));
  search_->setClearButtonEnabled(true);
  search_->setAccessibleName(tr("Search history"));
  // Qt's clear button is icon-only: name it for screen readers.
  for (QToolButton* b : search_->findChildren<QToolButton*>()) b->setAccessibleName(tr("Clear the search"));
  kind_ = new QComboBox(this);
  kind_->setObjectName(QStringLiteral("historyKind"));
  kind_->setAccessibleName(tr("Kind"));
  kind_->addItem(tr("Text and images"), QString());
  kind_->addItem(tr("Text"), QStringLiteral("text"));
  kind_->addItem(tr("Images"), QStringLiteral("image"));
  date_ = new QComboBox(this);
  date_->setObjectName(QStringLiteral("historyDate"));
  date_->setAccessibleName(tr("Date"));
  date_->addItem(tr("Any time"), 0);
  date_->addItem(tr("Today"), 1);
  date_->addItem(tr("Last 7 days"), 7);
  date_->addItem(tr("Last 30 days"), 30);

  table_ = new QTableWidget(0, ColumnCount, this);
  table_->setObjectName(QStringLiteral("historyTable"));
  table_->setHorizontalHeaderLabels({tr("Finished"), tr("Kind"), tr("State"), tr("Model"), tr("Prompt"), tr("Seed")});
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 8);  // compact rows: more of them in a strip
  table_->setCornerButtonEnabled(false);
  table_->horizontalHeader()->setStretchLastSection(false);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(Prompt, QHeaderView::Stretch);
  table_->setAccessibleName(tr("Finished jobs"));
  detail_ = new QTextBrowser(this);
  detail_->setObjectName(QStringLiteral("historyDetail"));
  detail_->setAccessibleName(tr("Job details"));
  reopen_ = new QPushButton(tr("Re&open"), this);
  reopen_->setObjectName(QStringLiteral("reopenButton"));
  reopen_->setToolTip(tr("Open the job in Write or Paint with the same parameters"));
  runAgain_ = new QPushButton(tr("Run &again"), this);
  runAgain_->setObjectName(QStringLiteral("runAgainButton"));
  runAgain_->setToolTip(tr("Queue the same request with the same seed (the same model version gives the same output)"));

  auto* filters = new QHBoxLayout;
  filters->addWidget(search_, 1);
  filters->addWidget(kind_);
  filters->addWidget(date_);
  // The actions beside the filters and the details beside the table: in a bottom dock the table
  // gets the whole height (stacked, it showed about a row and a half).
  filters->addWidget(reopen_);
  filters->addWidget(runAgain_);
  auto* split = new QSplitter(Qt::Horizontal, this);
  split->setObjectName(QStringLiteral("historySplit"));
  split->addWidget(table_);
  split->addWidget(detail_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addLayout(filters);
  layout->addWidget(split, 1);

  connect(search_, &QLineEdit::textChanged, this, &HistoryView::reload);
  connect(kind_, &QComboBox::currentIndexChanged, this, &HistoryView::reload);
  connect(date_, &QComboBox::currentIndexChanged, this, &HistoryView::reload);
  connect(table_, &QTableWidget::itemSelectionChanged, this, &HistoryView::showDetail);
  connect(table_, &QTableWidget::cellDoubleClicked, this, &HistoryView::reopenSelected);
  connect(reopen_, &QPushButton::clicked, this, &HistoryView::reopenSelected);
  connect(runAgain_, &QPushButton::clicked, this, &HistoryView::runAgainSelected);
  connect(bridge_, &bridge::EngineBridge::jobsChanged, this, [this](const QVector<JobInfo>& changed, const QVector<JobId>& removed) {
    bool any = !removed.isEmpty();
    for (const JobInfo& j : changed) any = any || finishedState(j.state) || finished_.contains(j.id);
    if (any) reload();
  });
  reload();
}

bool HistoryView::matches(const JobInfo& j) const {
  const QString kind = kind_->currentData().toString();
  if (!kind.isEmpty() && QString::fromStdString(j.kind) != kind) return false;
  const int days = date_->currentData().toInt();
  if (days > 0) {
    const QDateTime from = QDateTime(QDate::currentDate().addDays(1 - days), QTime(0, 0));
    if (QDateTime::fromMSecsSinceEpoch(j.finished_ms) < from) return false;
  }
  const QString q = search_->text().trimmed();
  if (q.isEmpty()) return true;
  return promptOf(j).contains(q, Qt::CaseInsensitive) || modelOf(j).contains(q, Qt::CaseInsensitive) ||
         QString::fromStdString(j.model_version).contains(q, Qt::CaseInsensitive);
}

void HistoryView::reload() {
  const JobId keep = selectedJob();
  finished_.clear();
  QVector<JobInfo> rows;
  for (const JobInfo& j : bridge_->jobs()) {
    if (!finishedState(j.state)) continue;
    finished_.insert(j.id, j);
    if (matches(j)) rows.push_back(j);
  }
  std::sort(rows.begin(), rows.end(), [](const JobInfo& a, const JobInfo& b) {
    return a.finished_ms != b.finished_ms ? a.finished_ms > b.finished_ms : a.id > b.id;
  });
  const QSignalBlocker block(table_);
  table_->setRowCount(0);
  table_->setRowCount(static_cast<int>(rows.size()));
  for (int r = 0; r < rows.size(); ++r) {
    const JobInfo& j = rows[r];
    auto set = [&](int col, const QString& text) {
      auto* item = new QTableWidgetItem(text);
      item->setData(Qt::UserRole, static_cast<qlonglong>(j.id));
      table_->setItem(r, col, item);
    };
    set(Finished, QDateTime::fromMSecsSinceEpoch(j.finished_ms).toString(QStringLiteral("yyyy-MM-dd HH:mm:ss")));
    set(Kind, QString::fromStdString(j.kind));
    set(State, QString::fromStdString(std::string(job_state_name(j.state))));
    set(Model, modelOf(j));
    set(Prompt, promptOf(j).simplified().left(200));
    set(Seed, QString::number(j.seed));
  }
  if (keep) selectJob(keep);
  showDetail();
}

QVector<JobId> HistoryView::shownJobs() const {
  QVector<JobId> out;
  for (int r = 0; r < table_->rowCount(); ++r) out.push_back(table_->item(r, 0)->data(Qt::UserRole).toLongLong());
  return out;
}

bool HistoryView::selectJob(JobId id) {
  for (int r = 0; r < table_->rowCount(); ++r)
    if (table_->item(r, 0)->data(Qt::UserRole).toLongLong() == id) {
      table_->selectRow(r);
      return true;
    }
  return false;
}

JobId HistoryView::selectedJob() const {
  const auto items = table_->selectedItems();
  return items.isEmpty() ? 0 : items.first()->data(Qt::UserRole).toLongLong();
}

QString HistoryView::detailText() const { return detail_->toPlainText(); }

void HistoryView::showDetail() {
  const JobId id = selectedJob();
  reopen_->setEnabled(id != 0);
  runAgain_->setEnabled(id != 0);
  if (!id || !finished_.contains(id)) {
    detail_->clear();
    return;
  }
  const JobInfo& j = finished_[id];
  QString html = QStringLiteral("<b>job #%1</b> — %2, %3<br>").arg(j.id).arg(QString::fromStdString(j.kind),
                                                                         QString::fromStdString(std::string(job_state_name(j.state))));
  html += tr("model: %1<br>digest: %2<br>seed: %3<br>")
              .arg(modelOf(j).toHtmlEscaped(), QString::fromStdString(j.model_version).toHtmlEscaped())
              .arg(j.seed);
  const std::string params = j.kind == "image" ? image_request_to_json(j.image_request) : request_to_json(j.request);
  html += tr("parameters: <code>%1</code><br>").arg(QString::fromStdString(params).toHtmlEscaped());
  if (j.kind == "image") {
    for (const auto& f : j.files) html += QStringLiteral("%1<br>").arg(QString::fromStdString(f).toHtmlEscaped());
  } else if (!j.text.empty()) {
    html += tr("<b>output</b> (%1 tokens, %2 tokens/s):<br>%3")
                .arg(j.stats.new_tokens)
                .arg(j.stats.tokens_per_s, 0, 'f', 1)
                .arg(QString::fromStdString(j.text).toHtmlEscaped().replace('\n', QStringLiteral("<br>")));
  }
  if (!j.error.empty()) html += tr("<br>error: %1").arg(QString::fromStdString(j.error).toHtmlEscaped());
  detail_->setHtml(html);
}

void HistoryView::reopenSelected() {
  const JobId id = selectedJob();
  if (!id || !finished_.contains(id)) return;
  const JobInfo& j = finished_[id];
  if (j.kind == "image") emit reopenImage(j);
  else emit reopenText(j);
}

void HistoryView::runAgainSelected() {
  const JobId id = selectedJob();
  if (!id) return;
  bridge_->run<Result<JobId>>(
      [id](Engine* e) -> Result<JobId> {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        auto job = e->job(id);
        if (!job.ok()) return job.status();
        // The seed it ran with (a random seed was fixed then); an image goes to
        // a new file (the default job-ID.png) instead of over the first one.
        if (job->kind == "image") {
          ImageRequest r = job->image_request;
          if (r.seed == SamplingParams::kRandomSeed) r.seed = job->seed;
          r.output.clear();
          return e->submit(r);
        }
        TextRequest r = job->request;
        if (r.sampling.seed == SamplingParams::kRandomSeed) r.sampling.seed = job->seed;
        return e->submit(r);
      },
      [this, id](Result<JobId> r) {
        if (!r.ok()) {
          emit statusMessage(tr("Run again failed: %1").arg(QString::fromStdString(r.status().message)));
          return;
        }
        emit statusMessage(tr("Job #%1 queued again as #%2").arg(id).arg(r.value()));
        emit ranAgain(id, r.value());
      });
}

}  // namespace atelier::ui
