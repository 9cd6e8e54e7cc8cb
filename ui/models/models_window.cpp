#include "models/models_window.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QLocale>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QScreen>
#include <QSet>
#include <QSettings>
#include <QSplitter>
#include <QTreeWidget>
#include <QVBoxLayout>

#include "settings/studio_settings.h"

namespace atelier::ui {

namespace {
enum Column { Name, Kind, Format, Architecture, Parameters, Size, Digest, Channels, Imported, Source, ColumnCount };
constexpr int kRefRole = Qt::UserRole;        // "name@N" on version rows
constexpr int kNameRole = Qt::UserRole + 1;   // the model's name on every row
constexpr int kKindRole = Qt::UserRole + 2;

QString human(int64_t n) {
  if (n >= 1000000000) return QStringLiteral("%1B").arg(static_cast<double>(n) / 1e9, 0, 'f', 1);
  if (n >= 1000000) return QStringLiteral("%1M").arg(static_cast<double>(n) / 1e6, 0, 'f', 1);
  if (n >= 1000) return QStringLiteral("%1K").arg(static_cast<double>(n) / 1e3, 0, 'f', 0);
  return QString::number(n);
}

QPushButton* button(const QString& text, const QString& name, const QString& tip, QWidget* parent) {
  auto* b = new QPushButton(text, parent);
  b->setObjectName(name);
  b->setToolTip(tip);
  return b;
}
}  // namespace

ModelsWindow::ModelsWindow(bridge::StoreWorker* store, bridge::EngineBridge* engine, QWidget* parent)
    : QWidget(parent), store_(store), engine_(engine) {
  setObjectName(QStringLiteral("modelsWindow"));
  setWindowTitle(tr("Models"));
  setAcceptDrops(true);

  tree_ = new QTreeWidget(this);
  tree_->setObjectName(QStringLiteral("modelTree"));
  tree_->setColumnCount(ColumnCount);
  tree_->setHeaderLabels({tr("Model"), tr("Kind"), tr("Format"), tr("Architecture"), tr("Parameters"), tr("Size"),
                          tr("sha256"), tr("Channels"), tr("Imported"), tr("Source")});
  tree_->setAlternatingRowColors(true);
  tree_->setRootIsDecorated(true);
  tree_->header()->setSectionResizeMode(QHeaderView::ResizeToContents);
  tree_->setAccessibleName(tr("Models and their versions"));

  verify_ = button(tr("&Verify"), QStringLiteral("verifyButton"), tr("Re-hash the version's files and compare with the recorded sha256"), this);
  channel_ = new QComboBox(this);
  channel_->setObjectName(QStringLiteral("channelBox"));
  channel_->addItems({QStringLiteral("dev"), QStringLiteral("stable"), QStringLiteral("prod")});
  channel_->setAccessibleName(tr("Channel"));
  channel_->setToolTip(tr("The channel Promote and Roll back act on"));
  promote_ = button(tr("P&romote"), QStringLiteral("promoteButton"), tr("Point the channel at the selected version"), this);
  rollback_ = button(tr("Roll &back"), QStringLiteral("rollbackButton"), tr("Point the channel back at the version it had before"), this);
  pin_ = button(tr("P&in for new jobs"), QStringLiteral("pinButton"), tr("New Write / Paint jobs use this version"), this);
  remove_ = button(tr("Re&move"), QStringLiteral("removeButton"), tr("Remove the version (refused while a queued job needs it)"), this);
  history_ = button(tr("&History"), QStringLiteral("historyButton"), tr("The model's audit log: imports, promotions, rollbacks, removals"), this);
  import_ = button(tr("&Import..."), QStringLiteral("importButton"), tr("Import a model file (or drop one on this window)"), this);
  pull_ = button(tr("Install from &catalog..."), QStringLiteral("pullButton"), tr("Install catalog models from the internet or a mirror folder"), this);
  cancel_ = button(tr("Cancel"), QStringLiteral("cancelButton"), tr("Stop the import, install or verification in progress"), this);
  cancel_->setEnabled(false);
  pause_ = button(tr("&Pause"), QStringLiteral("pauseButton"), tr("Pause the install; Resume goes on from where it stopped"), this);
  pause_->setEnabled(false);
  if (!QSettings().value(QStringLiteral("models/pausedPull/names")).toStringList().isEmpty()) {
    pause_->setText(tr("&Resume"));  // paused before the studio last closed
    pause_->setEnabled(true);
  }

  progress_ = new QProgressBar(this);
  progress_->setObjectName(QStringLiteral("progressBar"));
  progress_->setAccessibleName(tr("Progress"));
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  progressLabel_ = new QLabel(this);
  progressLabel_->setObjectName(QStringLiteral("progressLabel"));
  message_ = new QLabel(this);
  message_->setObjectName(QStringLiteral("modelsMessage"));
  message_->setWordWrap(true);
  message_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  fit_ = new QLabel(this);
  fit_->setObjectName(QStringLiteral("fitLabel"));
  fit_->setWordWrap(true);
  historyView_ = new QPlainTextEdit(this);
  historyView_->setObjectName(QStringLiteral("historyView"));
  historyView_->setReadOnly(true);
  historyView_->setPlaceholderText(tr("History: select a model and press History"));

  auto* actions = new QHBoxLayout;
  for (QWidget* w : std::initializer_list<QWidget*>{verify_, channel_, promote_, rollback_, pin_, remove_, history_}) actions->addWidget(w);
  actions->addStretch(1);
  actions->addWidget(import_);
  actions->addWidget(pull_);
  auto* bar = new QHBoxLayout;
  bar->addWidget(progressLabel_);
  bar->addWidget(progress_, 1);
  bar->addWidget(pause_);
  bar->addWidget(cancel_);

  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(tree_);
  split->addWidget(historyView_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(actions);
  layout->addWidget(split, 1);
  layout->addWidget(fit_);
  layout->addWidget(message_);
  layout->addLayout(bar);

  connect(tree_, &QTreeWidget::itemSelectionChanged, this, [this] {
    updateButtons();
    updateFit();
  });
  connect(verify_, &QPushButton::clicked, this, &ModelsWindow::verifySelected);
  connect(promote_, &QPushButton::clicked, this, &ModelsWindow::promoteSelected);
  connect(rollback_, &QPushButton::clicked, this, &ModelsWindow::rollbackSelected);
  connect(pin_, &QPushButton::clicked, this, &ModelsWindow::pinSelected);
  connect(remove_, &QPushButton::clicked, this, &ModelsWindow::removeSelected);
  connect(history_, &QPushButton::clicked, this, &ModelsWindow::showHistory);
  connect(cancel_, &QPushButton::clicked, this, &ModelsWindow::cancelTask);
  connect(pause_, &QPushButton::clicked, this, [this] { pulling_ ? pausePull() : resumePull(); });
  connect(pull_, &QPushButton::clicked, this, &ModelsWindow::showPull);
  connect(import_, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Import a model"), QString(),
                                                      tr("Models (*.gguf *.safetensors *.ckpt *.pth *.pt *.bin);;All files (*)"));
    if (!path.isEmpty()) importFile(path);
  });
  connect(store_, &bridge::StoreWorker::progress, this, [this](const QString& what, qint64 done, qint64 total) {
    if (!taskRunning_) return;
    progressLabel_->setText(what);
    if (total > 0) {
      progress_->setRange(0, 1000);
      progress_->setValue(static_cast<int>(1000.0 * static_cast<double>(done) / static_cast<double>(total)));
      progress_->setFormat(QStringLiteral("%1 / %2").arg(QLocale().formattedDataSize(done), QLocale().formattedDataSize(total)));
    } else {
      progress_->setRange(0, 0);  // unknown size: busy
    }
  });
  connect(store_, &bridge::StoreWorker::changed, this, [this] {
    refresh();
    emit storeChanged();
  });
  resize(1100, 560);
  updateButtons();
  refresh();
}

QString ModelsWindow::message() const { return message_->text(); }
QString ModelsWindow::fitText() const { return fit_->text(); }
bool ModelsWindow::busy() const { return taskRunning_; }

void ModelsWindow::say(const QString& text, bool error) {
  message_->setText(text);
  message_->setStyleSheet(error ? QStringLiteral("color: #e06060;") : QString());
}

void ModelsWindow::startTask(const QString& what) {
  taskRunning_ = true;
  progressLabel_->setText(what);
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  progress_->setFormat(QStringLiteral("%p%"));
  cancel_->setEnabled(true);
  updateButtons();
}

void ModelsWindow::endTask() {
  taskRunning_ = false;
  cancel_->setEnabled(false);
  progress_->setRange(0, 1000);
  updateButtons();
}

void ModelsWindow::startPull(const QStringList& names, const QString& mirror) {
  startTask(tr("installing %1").arg(names.join(QStringLiteral(", "))));
  pulling_ = true;
  pausing_ = false;
  pause_->setText(tr("&Pause"));
  pause_->setEnabled(true);
  store_->pull(names, mirror, bridge::while_alive(this, [this, names, mirror](Status s) {
    pulling_ = false;
    endTask();
    QSettings settings;
    if (s.code == StatusCode::Cancelled && pausing_) {
      // Kept for Resume, in this session or after a restart.
      settings.setValue(QStringLiteral("models/pausedPull/names"), names);
      settings.setValue(QStringLiteral("models/pausedPull/mirror"), mirror);
      pause_->setText(tr("&Resume"));
      pause_->setEnabled(true);
      progressLabel_->setText(tr("paused: %1").arg(names.join(QStringLiteral(", "))));
      say(tr("Install paused; Resume goes on from where it stopped"));
      return;
    }
    settings.remove(QStringLiteral("models/pausedPull"));
    pause_->setText(tr("&Pause"));
    pause_->setEnabled(false);
    if (!s.ok()) say(QString::fromStdString(s.message), s.code != StatusCode::Cancelled);
    else {
      progress_->setValue(1000);
      say(tr("Installed %1").arg(names.join(QStringLiteral(", "))));
    }
  }));
}

void ModelsWindow::pausePull() {
  if (!pulling_) return;
  pausing_ = true;
  pause_->setEnabled(false);
  store_->cancel();
  progressLabel_->setText(tr("pausing..."));
}

void ModelsWindow::resumePull() {
  if (taskRunning_) return;
  QSettings settings;
  const QStringList names = settings.value(QStringLiteral("models/pausedPull/names")).toStringList();
  if (names.isEmpty()) return;
  startPull(names, settings.value(QStringLiteral("models/pausedPull/mirror")).toString());
}

void ModelsWindow::cancelTask() {
  if (!taskRunning_) return;
  store_->cancel();
  progressLabel_->setText(tr("cancelling..."));
}

void ModelsWindow::refresh() {
  store_->list(bridge::while_alive(this, [this](Result<std::vector<StoreModel>> r) {
    if (!r.ok()) {
      say(QString::fromStdString(r.status().message), true);
      return;
    }
    fill(r.value());
  }));
}

void ModelsWindow::fill(const std::vector<StoreModel>& models) {
  const QString keep = selectedReference();
  const QLocale loc;
  tree_->clear();
  for (const StoreModel& m : models) {
    auto* top = new QTreeWidgetItem(tree_);
    const QString name = QString::fromStdString(m.name);
    top->setText(Name, name);
    top->setText(Kind, QString::fromStdString(m.kind));
    top->setText(Architecture, QString::fromStdString(m.architecture));
    top->setText(Source, QString::fromStdString(m.description));
    top->setToolTip(Source, QString::fromStdString(m.description + (m.licence.empty() ? "" : "\nlicence: " + m.licence)));
    top->setData(Name, kNameRole, name);
    top->setData(Name, kKindRole, QString::fromStdString(m.kind));
    for (const StoreVersion& v : m.versions) {
      auto* row = new QTreeWidgetItem(top);
      const QString ref = QStringLiteral("%1@%2").arg(name).arg(v.number);
      int64_t bytes = 0;
      for (const StoreFile& f : v.files) bytes += f.size;
      QStringList channels;
      for (const auto& c : v.channels) channels << QString::fromStdString(c);
      if (m.default_version == v.number) channels << tr("(default)");
      row->setText(Name, ref);
      row->setText(Kind, QString::fromStdString(v.kind.empty() ? m.kind : v.kind));
      row->setText(Format, QString::fromStdString(v.format));
      row->setText(Architecture, QString::fromStdString(v.architecture));
      row->setText(Parameters, v.parameters ? human(v.parameters) : QString());
      row->setText(Size, loc.formattedDataSize(bytes));
      row->setText(Digest, QString::fromStdString(v.digest.substr(0, 16)));
      row->setToolTip(Digest, QStringLiteral("sha256:") + QString::fromStdString(v.digest));
      row->setText(Channels, channels.join(QStringLiteral(", ")));
      row->setText(Imported, QDateTime::fromMSecsSinceEpoch(v.created_ms).toString(QStringLiteral("yyyy-MM-dd HH:mm")));
      row->setText(Source, QString::fromStdString(v.notes.empty() ? v.label : v.notes));
      row->setData(Name, kRefRole, ref);
      row->setData(Name, kNameRole, name);
      row->setData(Name, kKindRole, row->text(Kind));
    }
    top->setExpanded(true);
  }
  if (!keep.isEmpty()) select(keep);
  updateButtons();
  emit listed();
}

QString ModelsWindow::selectedReference() const {
  const auto items = tree_->selectedItems();
  return items.isEmpty() ? QString() : items.first()->data(Name, kRefRole).toString();
}

QString ModelsWindow::selectedName() const {
  const auto items = tree_->selectedItems();
  return items.isEmpty() ? QString() : items.first()->data(Name, kNameRole).toString();
}

QString ModelsWindow::selectedKind() const {
  const auto items = tree_->selectedItems();
  return items.isEmpty() ? QString() : items.first()->data(Name, kKindRole).toString();
}

bool ModelsWindow::select(const QString& reference) {
  for (int i = 0; i < tree_->topLevelItemCount(); ++i) {
    QTreeWidgetItem* top = tree_->topLevelItem(i);
    if (top->data(Name, kNameRole).toString() == reference) {
      tree_->setCurrentItem(top);
      return true;
    }
    for (int k = 0; k < top->childCount(); ++k)
      if (top->child(k)->data(Name, kRefRole).toString() == reference) {
        tree_->setCurrentItem(top->child(k));
        return true;
      }
  }
  return false;
}

void ModelsWindow::updateButtons() {
  const bool version = !selectedReference().isEmpty();
  const bool model = !selectedName().isEmpty();
  for (QPushButton* b : {verify_, promote_, pin_, remove_}) b->setEnabled(version && !taskRunning_);
  rollback_->setEnabled(model && !taskRunning_);
  history_->setEnabled(model);
  import_->setEnabled(!taskRunning_);
  pull_->setEnabled(!taskRunning_);
}

void ModelsWindow::updateFit() {
  const QString ref = selectedReference();
  if (ref.isEmpty()) {
    fit_->clear();
    return;
  }
  const StudioSettings s = StudioSettings::load();
  KvType kv = KvType::F16;
  kv_type_from_name(s.kvType.toStdString(), &kv);
  store_->fit(ref, qint64{s.kvMemoryMiB} << 20, kv,
              bridge::while_alive(this, [this, ref](bridge::MemoryFit f) {
                if (selectedReference() != ref) return;
                fit_->setText(f.text);
                fit_->setStyleSheet(f.fits ? QString() : QStringLiteral("color: #e06060;"));
              }));
}

void ModelsWindow::verifySelected() {
  const QString ref = selectedReference();
  if (ref.isEmpty() || taskRunning_) return;
  startTask(tr("verifying %1").arg(ref));
  store_->verify(ref, bridge::while_alive(this, [this, ref](Result<StoreVerifyReport> r) {
    endTask();
    if (!r.ok()) {
      say(r.status().code == StatusCode::Cancelled ? tr("Verification of %1 cancelled").arg(ref)
                                                   : QString::fromStdString(r.status().message),
          r.status().code != StatusCode::Cancelled);
      return;
    }
    progress_->setValue(1000);
    if (r->ok()) {
      say(tr("%1 verified: %2 file(s), %3, every sha256 matches").arg(ref).arg(r->blobs_checked).arg(QLocale().formattedDataSize(r->bytes_checked)));
      return;
    }
    QStringList problems;
    for (const auto& p : r->problems) problems << QString::fromStdString(p.path + ": " + p.problem);
    say(tr("%1 is damaged: %2").arg(ref, problems.join(QStringLiteral("; "))), true);
  }));
}

void ModelsWindow::promoteSelected() {
  const QString ref = selectedReference();
  const QString channel = channel_->currentText();
  if (ref.isEmpty()) return;
  store_->promote(ref, channel, bridge::while_alive(this, [this, ref, channel](Result<int> r) {
    if (!r.ok()) say(QString::fromStdString(r.status().message), true);
    else say(tr("%1 now points at %2").arg(channel, ref));
  }));
}

void ModelsWindow::rollbackSelected() {
  const QString name = selectedName();
  const QString channel = channel_->currentText();
  if (name.isEmpty()) return;
  store_->rollback(name, channel, bridge::while_alive(this, [this, name, channel](Result<int> r) {
    if (!r.ok()) say(QString::fromStdString(r.status().message), true);
    else if (r.value() == 0) say(tr("%1:%2 is now unset").arg(name, channel));
    else say(tr("%1:%2 rolled back to %1@%3").arg(name, channel).arg(r.value()));
  }));
}

void ModelsWindow::pinSelected() {
  const QString ref = selectedReference();
  if (ref.isEmpty()) return;
  const QString kind = selectedKind();
  QSettings().setValue(QStringLiteral("models/pinned/%1").arg(kind), ref);
  say(tr("New %1 jobs use %2").arg(kind, ref));
  emit pinned(kind, ref);
}

void ModelsWindow::removeSelected() {
  const QString ref = selectedReference();
  if (ref.isEmpty()) return;
  QVector<bridge::PendingJob> pending;
  if (engine_) {
    for (const JobInfo& j : engine_->jobs()) {
      if (j.state != JobState::Queued && j.state != JobState::Running) continue;
      pending.push_back({j.id, QString::fromStdString(std::string(job_state_name(j.state))),
                         QString::fromStdString(j.kind == "image" ? j.image_request.model : j.request.model)});
    }
  }
  store_->remove(ref, pending, bridge::while_alive(this, [this, ref](Status s) {
    if (!s.ok()) say(QString::fromStdString(s.message), true);
    else say(tr("%1 removed (its files go with `gc` once no version uses them)").arg(ref));
  }));
}

void ModelsWindow::showHistory() {
  const QString name = selectedName();
  if (name.isEmpty()) return;
  store_->history(name, bridge::while_alive(this, [this, name](Result<std::vector<StoreAuditEntry>> r) {
    if (!r.ok()) {
      say(QString::fromStdString(r.status().message), true);
      return;
    }
    QStringList lines;
    for (const StoreAuditEntry& e : r.value()) {
      QString line = QStringLiteral("%1  %2 %3@%4")
                         .arg(QDateTime::fromMSecsSinceEpoch(e.time_ms).toString(QStringLiteral("yyyy-MM-dd HH:mm:ss")),
                              QString::fromStdString(e.action), QString::fromStdString(e.model))
                         .arg(e.version);
      if (!e.channel.empty()) line += QStringLiteral(" %1").arg(QString::fromStdString(e.channel));
      if (e.previous_version) line += tr(" (was @%1)").arg(e.previous_version);
      if (!e.detail.empty()) line += QStringLiteral("  ") + QString::fromStdString(e.detail);
      lines << line;
    }
    historyView_->setPlainText(lines.isEmpty() ? tr("%1: no history").arg(name) : lines.join('\n'));
  }));
}

void ModelsWindow::importFile(const QString& path) {
  if (taskRunning_) {
    say(tr("Another task is running; wait for it or cancel it first"), true);
    return;
  }
  say(tr("reading the header of %1...").arg(QFileInfo(path).fileName()));
  store_->preview(path, bridge::while_alive(this, [this](bridge::ImportPreview p) {
    if (!p.ok) {
      say(tr("Cannot import %1: %2").arg(QFileInfo(p.path).fileName(), p.error), true);
      return;
    }
    say(QString());
    auto* dialog = new QDialog(this);
    dialog->setObjectName(QStringLiteral("importDialog"));
    dialog->setWindowTitle(tr("Import %1").arg(QFileInfo(p.path).fileName()));
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    auto* form = new QFormLayout(dialog);
    auto* name = new QLineEdit(p.suggestedName, dialog);
    name->setObjectName(QStringLiteral("importName"));
    name->setToolTip(tr("letters, digits, '.', '_' and '-'; an existing name gets a new version"));
    form->addRow(tr("Name"), name);
    form->addRow(tr("File"), new QLabel(p.path, dialog));
    form->addRow(tr("Format"), new QLabel(p.format, dialog));
    form->addRow(tr("Kind"), new QLabel(p.kind, dialog));
    auto* header = new QLabel(p.summary, dialog);
    header->setObjectName(QStringLiteral("importHeader"));
    header->setWordWrap(true);
    form->addRow(tr("Header"), header);
    if (p.kind == QLatin1String("text"))
      form->addRow(tr("Parameters"), new QLabel(tr("%1 (%2 layers, context %3, vocabulary %4)")
                                                    .arg(human(p.text.n_params))
                                                    .arg(p.text.n_layers)
                                                    .arg(p.text.n_ctx_train)
                                                    .arg(p.text.n_vocab),
                                                dialog));
    form->addRow(tr("Size"), new QLabel(QLocale().formattedDataSize(p.bytes), dialog));
    if (!p.tokenizer.isEmpty()) form->addRow(tr("Tokenizer"), new QLabel(p.tokenizer, dialog));
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, dialog);
    buttons->button(QDialogButtonBox::Ok)->setText(tr("Import"));
    buttons->button(QDialogButtonBox::Ok)->setObjectName(QStringLiteral("importConfirm"));
    form->addRow(buttons);
    connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
    connect(buttons, &QDialogButtonBox::accepted, dialog, [this, dialog, name, p] {
      const QString n = name->text().trimmed();
      dialog->accept();
      startTask(tr("hashing %1").arg(QFileInfo(p.path).fileName()));
      store_->import(p.path, n, p.tokenizer, bridge::while_alive(this, [this, n](Result<int> r) {
        endTask();
        if (!r.ok()) {
          const bool cancelled = r.status().code == StatusCode::Cancelled;
          say(cancelled ? tr("Import cancelled; nothing was recorded") : QString::fromStdString(r.status().message), !cancelled);
          return;
        }
        progress_->setValue(1000);
        say(tr("Imported %1@%2").arg(n).arg(r.value()));
        select(QStringLiteral("%1@%2").arg(n).arg(r.value()));
      }));
    });
    dialog->open();
  }));
}

void ModelsWindow::showPull() {
  if (taskRunning_) return;
  store_->catalog(bridge::while_alive(this, [this](Result<std::vector<CatalogEntry>> r) {
    if (!r.ok()) {
      say(QString::fromStdString(r.status().message), true);
      return;
    }
    auto* dialog = new QDialog(this);
    dialog->setObjectName(QStringLiteral("pullDialog"));
    dialog->setWindowTitle(tr("Install from the catalog"));
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    auto* layout = new QVBoxLayout(dialog);
    auto* list = new QListWidget(dialog);
    list->setObjectName(QStringLiteral("catalogList"));
    list->setAccessibleName(tr("Catalog models"));
    list->setWordWrap(true);  // a description longer than the screen is wide wraps rather than being cut off
    // What the store holds already is marked (and not offered again).
    QSet<QString> installed;
    for (int i = 0; i < tree_->topLevelItemCount(); ++i) installed.insert(tree_->topLevelItem(i)->data(Name, kNameRole).toString());
    int widest = 0;
    for (const CatalogEntry& e : r.value()) {
      int64_t bytes = 0;
      for (const auto& f : e.files) bytes += f.size;
      const QString name = QString::fromStdString(e.name);
      const bool have = installed.contains(name);
      auto* item = new QListWidgetItem(QStringLiteral("%1 — %2, %3: %4%5")
                                           .arg(name, QString::fromStdString(e.kind), QLocale().formattedDataSize(bytes),
                                                QString::fromStdString(e.description), have ? tr(" (installed)") : QString()),
                                       list);
      item->setData(Qt::UserRole, name);
      item->setToolTip(item->text());
      if (have) {
        item->setFlags(item->flags() & ~Qt::ItemIsEnabled);
      } else {
        item->setFlags(item->flags() | Qt::ItemIsUserCheckable);
        item->setCheckState(Qt::Unchecked);
      }
      widest = std::max(widest, list->fontMetrics().horizontalAdvance(item->text()));
    }
    layout->addWidget(list, 1);
    // As wide as the longest entry (and its check box), within the screen: names and sizes are read whole.
    const int screenWidth = screen() ? screen()->availableGeometry().width() : 1280;
    dialog->resize(std::min(widest + 120, screenWidth * 9 / 10), std::max(320, dialog->sizeHint().height()));
    auto* mirrorRow = new QHBoxLayout;
    auto* mirror = new QLineEdit(QSettings().value(QStringLiteral("models/mirror")).toString(), dialog);
    mirror->setObjectName(QStringLiteral("mirrorEdit"));
    mirror->setPlaceholderText(tr("a mirror folder (optional; else the catalog's URLs)"));
    mirror->setAccessibleName(tr("Mirror folder"));
    auto* browse = new QPushButton(tr("Browse..."), dialog);
    mirrorRow->addWidget(new QLabel(tr("Mirror"), dialog));
    mirrorRow->addWidget(mirror, 1);
    mirrorRow->addWidget(browse);
    layout->addLayout(mirrorRow);
    connect(browse, &QPushButton::clicked, dialog, [dialog, mirror] {
      const QString d = QFileDialog::getExistingDirectory(dialog, tr("Mirror folder"), mirror->text());
      if (!d.isEmpty()) mirror->setText(d);
    });
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, dialog);
    buttons->button(QDialogButtonBox::Ok)->setText(tr("Install"));
    buttons->button(QDialogButtonBox::Ok)->setObjectName(QStringLiteral("pullConfirm"));
    layout->addWidget(buttons);
    connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
    connect(buttons, &QDialogButtonBox::accepted, dialog, [this, dialog, list, mirror] {
      QStringList names;
      for (int i = 0; i < list->count(); ++i)
        if (list->item(i)->checkState() == Qt::Checked) names << list->item(i)->data(Qt::UserRole).toString();
      const QString m = mirror->text().trimmed();
      dialog->accept();
      if (names.isEmpty()) return;
      QSettings().setValue(QStringLiteral("models/mirror"), m);
      startPull(names, m);
    });
    dialog->open();
  }));
}

void ModelsWindow::dragEnterEvent(QDragEnterEvent* event) {
  for (const QUrl& u : event->mimeData()->urls())
    if (u.isLocalFile()) {
      event->acceptProposedAction();
      return;
    }
}

void ModelsWindow::dropEvent(QDropEvent* event) {
  for (const QUrl& u : event->mimeData()->urls())
    if (u.isLocalFile()) {
      event->acceptProposedAction();
      importFile(u.toLocalFile());
      return;
    }
}

}  // namespace atelier::ui
