#include "write/write_tab.h"

#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QDateTime>
#include <QDoubleSpinBox>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QKeyEvent>
#include <QLabel>
#include <QListWidget>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QShortcut>
#include <QtConcurrent/QtConcurrentRun>
#include <QSettings>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedWidget>
#include <QTextBrowser>
#include <QTextCursor>
#include <QTimer>
#include <QUrl>
#include <QVBoxLayout>

#include <map>

#include "common/fold_section.h"
#include "common/model_picker.h"
#include "common/seed_box.h"
#include "settings/studio_settings.h"
#include "write/context_fit.h"

namespace atelier::ui {

// ---------------------------------------------------------------- prompt editor

void PromptEdit::remember(const QString& prompt) {
  if (prompt.trimmed().isEmpty()) return;
  history_.removeAll(prompt);
  history_ << prompt;
  while (history_.size() > 100) history_.removeFirst();
  cursor_ = static_cast<int>(history_.size());
}

void PromptEdit::keyPressEvent(QKeyEvent* e) {
  const bool ctrl = e->modifiers() & Qt::ControlModifier;
  const bool shift = e->modifiers() & Qt::ShiftModifier;
  if (ctrl && (e->key() == Qt::Key_Return || e->key() == Qt::Key_Enter)) {
    if (shift) emit queueRequested();
    else emit generateRequested();
    return;
  }
  if (e->key() == Qt::Key_Escape) {
    emit stopRequested();
    return;
  }
  if (ctrl && (e->key() == Qt::Key_Up || e->key() == Qt::Key_Down) && !history_.isEmpty()) {
    cursor_ = std::clamp(cursor_ + (e->key() == Qt::Key_Up ? -1 : 1), 0, static_cast<int>(history_.size()));
    setPlainText(cursor_ < history_.size() ? history_[cursor_] : QString());
    moveCursor(QTextCursor::End);
    return;
  }
  QPlainTextEdit::keyPressEvent(e);
}

// ---------------------------------------------------------------- helpers

namespace {
QString roleTitle(const QString& role) {
  if (role == QLatin1String("user")) return QObject::tr("You");
  if (role == QLatin1String("assistant")) return QObject::tr("Assistant");
  return role;
}

QString htmlText(const QString& text) { return text.toHtmlEscaped(); }

template <class Spin>
Spin* spin(QWidget* parent, const char* name, const QString& tip) {
  auto* s = new Spin(parent);
  s->setObjectName(QString::fromLatin1(name));
  s->setToolTip(tip);
  return s;
}

}  // namespace

// ---------------------------------------------------------------- the tab

WriteTab::WriteTab(bridge::EngineBridge* bridge, ConversationStore* store, QWidget* parent)
    : QWidget(parent), bridge_(bridge), store_(store) {
  setObjectName(QStringLiteral("writeTab"));
  auto* splitter = new QSplitter(Qt::Horizontal, this);
  splitter->setObjectName(QStringLiteral("writeSplitter"));
  auto* outer = new QHBoxLayout(this);
  outer->setContentsMargins(4, 4, 4, 4);
  outer->addWidget(splitter);

  // Left: conversations and parameters.
  auto* panel = new QWidget;
  auto* form = new QFormLayout(panel);
  form_ = form;
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  mode_ = new QComboBox(panel);
  mode_->setObjectName(QStringLiteral("writeMode"));
  mode_->addItem(tr("Chat"), QStringLiteral("chat"));
  mode_->addItem(tr("Notebook"), QStringLiteral("notebook"));
  mode_->setToolTip(tr("Chat: a conversation in the model's chat template. Notebook: the model continues your document as it is"));
  form->addRow(tr("Mode"), mode_);
  conversationList_ = new QListWidget(panel);
  conversationList_->setObjectName(QStringLiteral("conversations"));
  conversationList_->setToolTip(tr("Saved conversations and documents (kept in the data dir)"));
  conversationList_->setMaximumHeight(104);  // five rows; it scrolls beyond (the panel fits the default window)
  auto* newButton = new QPushButton(tr("New"), panel);
  newButton->setObjectName(QStringLiteral("newConversation"));
  newButton->setToolTip(tr("Start a new conversation or document"));
  auto* deleteButton = new QPushButton(tr("Delete"), panel);
  deleteButton->setObjectName(QStringLiteral("deleteConversation"));
  deleteButton->setToolTip(tr("Delete the selected conversation"));
  auto* convButtons = new QHBoxLayout;
  convButtons->addWidget(newButton);
  convButtons->addWidget(deleteButton);
  form->addRow(conversationList_);
  form->addRow(convButtons);

  model_ = new ModelPicker(bridge_, QStringLiteral("text"), panel);
  model_->setObjectName(QStringLiteral("writeModel"));
  form->addRow(tr("Model"), model_);
  templateNote_ = new QLabel(panel);
  templateNote_->setObjectName(QStringLiteral("templateNote"));
  templateNote_->setWordWrap(true);
  // A wrapped label in a form under a scroll area gets one line's height; the notes take two at this width.
  templateNote_->setMinimumHeight(templateNote_->fontMetrics().lineSpacing() * 2 + 4);
  templateNote_->setAlignment(Qt::AlignLeft | Qt::AlignTop);
  form->addRow(templateNote_);
  system_ = new QPlainTextEdit(panel);
  system_->setObjectName(QStringLiteral("systemPrompt"));
  system_->setPlaceholderText(tr("optional"));
  system_->setToolTip(tr("System prompt: instructions the chat model sees before the conversation"));
  system_->setMaximumHeight(64);
  form->addRow(tr("System"), system_);
  temperature_ = spin<QDoubleSpinBox>(panel, "temperature", tr("Temperature: 0 always picks the likeliest token; higher is more varied"));
  temperature_->setRange(0, 5);
  temperature_->setSingleStep(0.05);
  temperature_->setValue(0.8);
  topK_ = spin<QSpinBox>(panel, "topK", tr("Top-k: sample among the k likeliest tokens (0: off)"));
  topK_->setRange(0, 1000);
  topK_->setValue(40);
  // Two settings a row (the panel fits the default window without scrolling).
  auto pair = [panel](QWidget* a, const QString& label, QWidget* b) {
    auto* row = new QHBoxLayout;
    row->setSpacing(6);
    row->addWidget(a, 1);
    auto* l = new QLabel(label, panel);
    l->setBuddy(b);
    row->addWidget(l);
    row->addWidget(b, 1);
    return row;
  };
  auto buddy = [panel](const QString& label, QWidget* field) {
    auto* l = new QLabel(label, panel);
    l->setBuddy(field);
    l->setMinimumWidth(l->sizeHint().width() + 2);  // its hint alone clipped the last letter
    return l;
  };
  form->addRow(buddy(tr("T&emperature"), temperature_), pair(temperature_, tr("Top-&k"), topK_));
  topP_ = spin<QDoubleSpinBox>(panel, "topP", tr("Top-p: sample among the likeliest tokens that add up to p (1: off)"));
  topP_->setRange(0, 1);
  topP_->setSingleStep(0.01);
  topP_->setValue(0.95);
  minP_ = spin<QDoubleSpinBox>(panel, "minP", tr("Min-p: drop tokens less likely than p times the likeliest (0: off)"));
  minP_->setRange(0, 1);
  minP_->setSingleStep(0.01);
  minP_->setValue(0.05);
  form->addRow(buddy(tr("Top-&p"), topP_), pair(topP_, tr("M&in-p"), minP_));
  repeatPenalty_ = spin<QDoubleSpinBox>(panel, "repeatPenalty", tr("Repeat penalty: above 1 discourages repeating recent tokens (1: off)"));
  repeatPenalty_->setRange(0.5, 2);
  repeatPenalty_->setSingleStep(0.05);
  repeatPenalty_->setValue(1.0);
  maxTokens_ = spin<QSpinBox>(panel, "maxTokens", tr("The most tokens one answer may have"));
  maxTokens_->setRange(1, 32768);
  maxTokens_->setValue(256);
  form->addRow(tr("Max new tokens"), maxTokens_);
  contextSize_ = spin<QSpinBox>(panel, "contextSize",
                                tr("This conversation's context: the most tokens its prompt and answer may hold together "
                                   "(up to the model's training context). A longer context costs more KV memory."));
  contextSize_->setRange(16, 4096);
  contextSize_->setSingleStep(256);
  contextSize_->setValue(4096);
  contextSize_->setSuffix(tr(" tokens"));
  form->addRow(tr("Context"), contextSize_);
  contextNote_ = new QLabel(panel);
  contextNote_->setObjectName(QStringLiteral("contextNote"));
  contextNote_->setWordWrap(true);
  form->addRow(contextNote_);
  overflow_ = new QComboBox(panel);
  overflow_->setObjectName(QStringLiteral("overflowPolicy"));
  overflow_->addItem(tr("Truncate the middle"), QStringLiteral("truncate-middle"));
  overflow_->addItem(tr("Rolling window"), QStringLiteral("rolling-window"));
  overflow_->addItem(tr("Stop at the limit"), QStringLiteral("stop-at-limit"));
  overflow_->setToolTip(tr("When the conversation outgrows its context: truncate the middle (keep the system prompt, the first "
                           "exchange and the latest messages), a rolling window (keep the system prompt and the latest messages), "
                           "or stop at the limit (nothing is left out; the answer ends when the context is full)"));
  form->addRow(tr("Overflow"), overflow_);
  stops_ = new QPlainTextEdit(panel);
  stops_->setObjectName(QStringLiteral("stopStrings"));
  stops_->setToolTip(tr("Stop strings, one per line: generation ends before the first one"));
  stops_->setMaximumHeight(60);
  seed_ = new SeedBox(panel);
  seed_->setObjectName(QStringLiteral("writeSeed"));
  // Less used: folded under "More" (opened by itself when a restored value is not the default).
  moreFold_ = new FoldSection(tr("More: repeat penalty, stop strings, seed"), panel);
  moreFold_->setObjectName(QStringLiteral("writeMore"));
  auto* mf = new QFormLayout(moreFold_->body());
  mf->setContentsMargins(0, 0, 0, 0);
  mf->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  mf->addRow(tr("Repeat penalty"), repeatPenalty_);
  mf->addRow(tr("Stop strings"), stops_);
  mf->addRow(tr("Seed"), seed_);
  form->addRow(moreFold_);
  auto* scroll = new QScrollArea;
  scroll->setObjectName(QStringLiteral("writeScroll"));
  scroll->setWidget(panel);
  scroll->setWidgetResizable(true);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  // Wide enough for the panel's widest row, so nothing is cut off at the right.
  scroll->setMinimumWidth(panel->minimumSizeHint().width() + scroll->verticalScrollBar()->sizeHint().width() + 4);
  splitter->addWidget(scroll);

  // Right: the output, the prompt and the actions.
  auto* right = new QWidget;
  auto* col = new QVBoxLayout(right);
  col->setContentsMargins(0, 0, 0, 0);
  views_ = new QStackedWidget(right);
  chatView_ = new QTextBrowser(views_);
  chatView_->setObjectName(QStringLiteral("chatView"));
  chatView_->setOpenLinks(false);
  chatView_->setAccessibleName(tr("Conversation"));
  connect(chatView_, &QTextBrowser::anchorClicked, this, &WriteTab::onAnchor);
  thinkingTick_ = new QTimer(this);
  thinkingTick_->setInterval(250);
  connect(thinkingTick_, &QTimer::timeout, this, &WriteTab::render);
  notebook_ = new QPlainTextEdit(views_);
  notebook_->setObjectName(QStringLiteral("notebook"));
  notebook_->setAccessibleName(tr("Notebook document"));
  notebook_->setPlaceholderText(tr("Write the beginning of a text; Generate continues it."));
  views_->addWidget(chatView_);
  views_->addWidget(notebook_);
  col->addWidget(views_, 1);
  prompt_ = new PromptEdit(right);
  prompt_->setObjectName(QStringLiteral("prompt"));
  prompt_->setPlaceholderText(tr("Message (Ctrl+Enter generates, Ctrl+Shift+Enter queues, Esc stops, Ctrl+Up/Down: earlier prompts)"));
  prompt_->setToolTip(prompt_->placeholderText());
  prompt_->setMaximumHeight(110);
  col->addWidget(prompt_);
  auto* buttons = new QHBoxLayout;
  auto button = [&](const char* name, const QString& text, const QString& tip) {
    auto* b = new QPushButton(text, right);
    b->setObjectName(QString::fromLatin1(name));
    b->setToolTip(tip);
    buttons->addWidget(b);
    return b;
  };
  generateButton_ = button("generate", tr("Generate"), tr("Generate now (Ctrl+Enter)"));
  queueButton_ = button("queue", tr("Queue"), tr("Add to the queue behind other jobs (Ctrl+Shift+Enter)"));
  stopButton_ = button("stop", tr("Stop"), tr("Stop the generation, whatever it is doing (Esc)"));
  regenerateButton_ = button("regenerate", tr("Regenerate"), tr("A new answer in place of the last one; earlier answers stay as variants (Ctrl+R)"));
  continueButton_ = button("continue", tr("Continue"), tr("The model goes on writing the last answer (or the document)"));
  copyButton_ = button("copy", tr("Copy"), tr("Copy the conversation as Markdown"));
  saveButton_ = button("saveMarkdown", tr("Save .md"), tr("Save the conversation as a Markdown file"));
  buttons->addStretch(1);
  phaseLabel_ = new QLabel(right);
  phaseLabel_->setObjectName(QStringLiteral("writePhase"));
  buttons->addWidget(phaseLabel_);
  col->addLayout(buttons);
  splitter->addWidget(right);
  splitter->setStretchFactor(1, 1);
  splitter->setSizes({scroll->minimumWidth(), 700});

  // Window-wide: Esc stops whatever has focus (after a click on Generate or Regenerate focus moves on to
  // another button); Ctrl+Enter generates from the notebook's document as from the prompt.
  stopKey_ = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  stopKey_->setContext(Qt::WindowShortcut);
  connect(stopKey_, &QShortcut::activated, this, &WriteTab::stop);
  for (const Qt::Key key : {Qt::Key_Return, Qt::Key_Enter}) {
    auto* go = new QShortcut(QKeySequence(Qt::CTRL | key), this);
    go->setContext(Qt::WidgetWithChildrenShortcut);
    connect(go, &QShortcut::activated, this, &WriteTab::generate);
    auto* later = new QShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | key), this);
    later->setContext(Qt::WidgetWithChildrenShortcut);
    connect(later, &QShortcut::activated, this, &WriteTab::queue);
  }
  auto* again = new QShortcut(QKeySequence(Qt::CTRL | Qt::Key_R), this);
  again->setContext(Qt::WidgetWithChildrenShortcut);
  connect(again, &QShortcut::activated, this, [this] {
    if (conv().mode != QLatin1String("notebook")) regenerate();
  });
  connect(contextSize_, &QSpinBox::valueChanged, this, [this](int v) {
    if (conv().contextTokens != v && phase_ == Phase::Idle) {
      conv().contextTokens = v;
      persist();
    }
    updateContextControls();
  });
  connect(overflow_, &QComboBox::currentIndexChanged, this, [this] {
    const QString name = overflow_->currentData().toString();
    if (conv().overflow != name && phase_ == Phase::Idle) {
      conv().overflow = name;
      persist();
    }
  });
  connect(prompt_, &PromptEdit::generateRequested, this, &WriteTab::generate);
  connect(prompt_, &PromptEdit::queueRequested, this, &WriteTab::queue);
  connect(prompt_, &PromptEdit::stopRequested, this, &WriteTab::stop);
  connect(generateButton_, &QPushButton::clicked, this, &WriteTab::generate);
  connect(queueButton_, &QPushButton::clicked, this, &WriteTab::queue);
  connect(stopButton_, &QPushButton::clicked, this, &WriteTab::stop);
  connect(regenerateButton_, &QPushButton::clicked, this, &WriteTab::regenerate);
  connect(continueButton_, &QPushButton::clicked, this, &WriteTab::continueLast);
  connect(copyButton_, &QPushButton::clicked, this, [this] { QApplication::clipboard()->setText(transcript()); });
  connect(saveButton_, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getSaveFileName(this, tr("Save as Markdown"), conv().title + QStringLiteral(".md"),
                                                      tr("Markdown (*.md)"));
    if (!path.isEmpty()) saveMarkdown(path);
  });
  connect(newButton, &QPushButton::clicked, this, &WriteTab::newConversation);
  connect(deleteButton, &QPushButton::clicked, this, [this] {
    if (phase_ != Phase::Idle || conversations_.size() <= 1) return;
    store_->remove(conv().id);
    conversations_.remove(current_);
    current_ = 0;
    refreshConversationList();
    selectConversation(0);
  });
  connect(conversationList_, &QListWidget::currentRowChanged, this, &WriteTab::selectConversation);
  connect(mode_, &QComboBox::currentIndexChanged, this, [this] { setMode(mode_->currentData().toString()); });
  connect(notebook_, &QPlainTextEdit::textChanged, this, [this] {
    if (phase_ == Phase::Idle && conv().mode == QLatin1String("notebook")) {
      conv().document = notebook_->toPlainText();
      persist();
    }
  });
  connect(model_, &ModelPicker::referenceChanged, this, [this](const QString& ref) {
    info_.reset();
    infoFor_ = ref;
    updateTemplateNote();
    if (!ref.isEmpty()) bridge_->requestModelInfo(ref);
  });
  connect(bridge_, &bridge::EngineBridge::modelInfoReady, this,
          [this](const QString& ref, bool ok, const ModelInfo& info, const QString& error) {
            if (ref != infoFor_) return;
            if (ok) {
              info_ = info;
            } else {
              templateNote_->setText(tr("Cannot read this model: %1").arg(error));
            }
            updateTemplateNote();
          });
  connect(bridge_, &bridge::EngineBridge::event, this, &WriteTab::onEvent);
  connect(bridge_, &bridge::EngineBridge::pausedChanged, this, [this] {
    if (phase_ == Phase::Queued) setPhase(Phase::Queued);  // the text says whether the queue is paused
  });
  // A client of another process's queue hears of its job through the job list only.
  connect(bridge_, &bridge::EngineBridge::jobsChanged, this, [this](const QVector<JobInfo>& changed, const QVector<JobId>&) {
    if (job_ == 0) return;
    for (const JobInfo& j : changed) {
      if (j.id != job_) continue;
      if (j.state == JobState::Running && phase_ == Phase::Queued) setPhase(Phase::Loading);
      else if (j.state == JobState::Completed) finishJob(QString::fromStdString(j.text), tr("%1 tokens, stop: %2").arg(j.stats.new_tokens).arg(QString::fromStdString(j.stop_reason)));
      else if (j.state == JobState::Failed) finishJob(streamed_, tr("failed: %1").arg(QString::fromStdString(j.error)), /*error=*/true);
      else if (j.state == JobState::Cancelled) finishJob(streamed_, tr("stopped"));
    }
  });

  // Conversations from the data dir, or a first empty one.
  if (store_) conversations_ = store_->loadAll();
  conversations_.erase(std::remove_if(conversations_.begin(), conversations_.end(),
                                      [](const Conversation& c) { return c.title.isEmpty() && c.turns.isEmpty() && c.document.isEmpty(); }),
                       conversations_.end());
  if (conversations_.isEmpty()) {
    Conversation c;
    c.id = store_ ? store_->allocateId() : 1;
    c.title = tr("New conversation");
    conversations_.push_back(c);
  }
  refreshConversationList();
  selectConversation(0);
  setPhase(Phase::Idle);
}

WriteTab::~WriteTab() {
  if (store_) store_->flush();
}

void WriteTab::refreshConversationList() {
  const QSignalBlocker block(conversationList_);
  conversationList_->clear();
  for (const Conversation& c : conversations_)
    conversationList_->addItem((c.mode == QLatin1String("notebook") ? tr("Notebook: ") : QString()) + c.title);
  conversationList_->setCurrentRow(current_);
}

void WriteTab::selectConversation(int row) {
  if (row < 0 || row >= conversations_.size()) return;
  if (phase_ != Phase::Idle && row != current_) {
    conversationList_->setCurrentRow(current_);
    emit statusMessage(tr("Stop the generation before switching conversations"));
    return;
  }
  if (row != current_) expanded_.clear();
  current_ = row;
  {
    const QSignalBlocker b1(mode_), b2(system_), b3(notebook_);
    mode_->setCurrentIndex(conv().mode == QLatin1String("notebook") ? 1 : 0);
    system_->setPlainText(conv().system);
    notebook_->setPlainText(conv().document);
    const QSignalBlocker b4(overflow_);
    overflow_->setCurrentIndex(std::max(0, overflow_->findData(conv().overflow)));
  }
  chatError_.clear();
  updateContextControls();
  views_->setCurrentIndex(conv().mode == QLatin1String("notebook") ? 1 : 0);
  if (!conv().model.isEmpty()) model_->setReference(conv().model);
  render();
}

void WriteTab::newConversation() {
  if (phase_ != Phase::Idle) return;
  // An untouched conversation of the same kind is the new one: empty ones do not pile up.
  if (conv().turns.isEmpty() && conv().document.isEmpty() && conv().mode == mode_->currentData().toString()) {
    chatError_.clear();
    render();
    return;
  }
  Conversation c;
  c.id = store_ ? store_->allocateId() : QDateTime::currentMSecsSinceEpoch();
  c.mode = mode_->currentData().toString();
  c.title = c.mode == QLatin1String("notebook") ? tr("New document") : tr("New conversation");
  c.system = system_->toPlainText();
  c.overflow = conv().overflow;  // the context starts at the model's whole training context
  conversations_.prepend(c);
  current_ = 0;
  refreshConversationList();
  selectConversation(0);
}

void WriteTab::setMode(const QString& mode) {
  if (phase_ != Phase::Idle) return;
  const int index = mode == QLatin1String("notebook") ? 1 : 0;
  if (mode_->currentIndex() != index) {
    const QSignalBlocker b(mode_);
    mode_->setCurrentIndex(index);
  }
  if (conv().mode != mode) {
    // A conversation keeps its kind; switching starts a new one of the other kind
    // unless this one is still empty.
    if (conv().turns.isEmpty() && conv().document.isEmpty()) {
      conv().mode = mode;
      conv().title = mode == QLatin1String("notebook") ? tr("New document") : tr("New conversation");
      refreshConversationList();
    } else {
      newConversation();
      conv().mode = mode;
      conv().title = mode == QLatin1String("notebook") ? tr("New document") : tr("New conversation");
      refreshConversationList();
    }
  }
  views_->setCurrentIndex(index);
  // A notebook is the document alone: the chat's message box, system prompt and overflow policy do not apply.
  const bool chat = index == 0;
  prompt_->setVisible(chat);
  form_->setRowVisible(system_, chat);
  form_->setRowVisible(overflow_, chat);
  regenerateButton_->setVisible(chat);
  updateTemplateNote();
  render();
}

void WriteTab::updateTemplateNote() {
  QString note;
  if (conv().mode == QLatin1String("notebook")) note = tr("Notebook: the model continues the document exactly as written.");
  else if (!info_) note = model_->reference().isEmpty() ? tr("Install a text model (Models) to start.") : tr("Reading the model...");
  else if (info_->chat_template.empty())
    note = tr("This model has no chat template: the conversation is written as plain \"User:\" / \"Assistant:\" lines.");
  else note = tr("Chat template from the model (%1).").arg(QString::fromStdString(info_->architecture));
  templateNote_->setText(note);
  updateContextControls();
}

namespace {
QString bytesText(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return QObject::tr("%1 KiB").arg((bytes + 512) >> 10);
  if (bytes < (int64_t{1} << 30)) return QObject::tr("%1 MiB").arg(static_cast<double>(bytes) / (1 << 20), 0, 'f', 1);
  return QObject::tr("%1 GiB").arg(static_cast<double>(bytes) / (1 << 30), 0, 'f', 2);
}
}  // namespace

void WriteTab::updateContextControls() {
  const bool chat = conv().mode != QLatin1String("notebook");
  form_->setRowVisible(contextSize_, chat);
  form_->setRowVisible(contextNote_, chat);
  const int trained = info_ ? default_context_tokens(info_->n_ctx_train) : 0;
  {
    const QSignalBlocker b(contextSize_);
    if (trained > 0) contextSize_->setMaximum(trained);
    const int want = conv().contextTokens > 0 ? conv().contextTokens : contextSize_->maximum();
    contextSize_->setValue(std::min(want, contextSize_->maximum()));
  }
  contextTokens_ = chat ? contextSize_->value() : trained;
  if (!info_) {
    contextNote_->clear();
    return;
  }
  const StudioSettings settings = StudioSettings::load();
  KvType kv = KvType::F16;
  kv_type_from_name(settings.kvType.toStdString(), &kv);
  const int64_t perToken = kv_bytes_per_token(*info_, kv);
  const int64_t bytes = perToken * contextSize_->value();
  const int64_t budget = int64_t{settings.kvMemoryMiB} << 20;
  QString note = tr("KV cache for %1 tokens: %2 (%3) of the %4 KV budget; trained for %5 tokens")
                     .arg(contextSize_->value())
                     .arg(bytesText(bytes), settings.kvType, bytesText(budget))
                     .arg(trained);
  if (bytes > budget) note += tr(". More than the budget: lower the context or raise the KV memory in Settings");
  contextNote_->setText(note);
}

// ---------------------------------------------------------------- rendering

void WriteTab::render() {
  if (conv().mode == QLatin1String("notebook")) {
    if (notebook_->toPlainText() != conv().document) {
      const QSignalBlocker b(notebook_);
      notebook_->setPlainText(conv().document);
    }
    return;
  }
  QString html = QStringLiteral("<html><body>");
  if (conv().turns.isEmpty())
    html += QStringLiteral("<p style='color:gray'>%1</p>").arg(tr("Type a message below and press Ctrl+Enter."));
  for (int i = 0; i < conv().turns.size(); ++i) {
    const ChatTurn& t = conv().turns[i];
    const bool streaming = phase_ != Phase::Idle && i == jobTurn_;
    html += QStringLiteral("<p style='margin-top:12px'><b>%1</b>").arg(roleTitle(t.role));
    if (!streaming) {
      html += QStringLiteral(" &nbsp; <a href='edit:%1'>%2</a> <a href='copy:%1'>%3</a>").arg(i).arg(tr("edit"), tr("copy"));
      if (t.variants.size() > 1)
        html += QStringLiteral(" &nbsp; <a href='prev:%1'>&lt;</a> %2/%3 <a href='next:%1'>&gt;</a>")
                    .arg(i)
                    .arg(t.current + 1)
                    .arg(t.variants.size());
    }
    html += QStringLiteral("</p>");
    // A thinking model's reasoning: a header that folds it (open on click), above the answer.
    const QString reasoning = streaming && parser_ ? streamReasoning_ : t.reasoningText();
    if (!reasoning.isEmpty()) {
      html += QStringLiteral("<p style='color:#8a8f98'><a href='think:%1' style='color:#8a8f98; text-decoration:none'>%2</a></p>")
                  .arg(i)
                  .arg(htmlText(thinkingHeader(i, streaming)));
      if (expanded_.contains(i))
        html += QStringLiteral("<p style='color:#8a8f98; white-space:pre-wrap; margin-left:18px'>%1</p>").arg(htmlText(reasoning));
    }
    // pre-wrap keeps the model's newlines and spaces as they are (and as the text copies out).
    const QString text = streaming && parser_ ? t.text() + streamContent_ : t.text();
    html += QStringLiteral("<p style='white-space:pre-wrap'>%1</p>").arg(htmlText(text));
  }
  if (!chatError_.isEmpty())
    html += QStringLiteral("<p style='color:#e06c60; white-space:pre-wrap'><b>%1</b> %2</p>").arg(tr("Not answered:"), htmlText(chatError_));
  html += QStringLiteral("</body></html>");
  chatView_->setHtml(html);
  chatView_->moveCursor(QTextCursor::End);
}

QString WriteTab::thinkingHeader(int turn, bool streaming) const {
  const QString arrow = expanded_.contains(turn) ? QStringLiteral("\u25BE ") : QStringLiteral("\u25B8 ");
  if (!streaming) return arrow + tr("Thought");
  const qint64 ms = thinkingMs_ >= 0 ? thinkingMs_ : thinkingClock_.isValid() ? thinkingClock_.elapsed() : 0;
  const QString seconds = QString::number(ms / 1000.0, 'f', 1);
  return arrow + (thinkingMs_ >= 0 ? tr("Thought for %1 s").arg(seconds) : tr("Thinking\u2026 %1 s").arg(seconds));
}

void WriteTab::takeDelta(const ChatDelta& d) {
  if (!d.reasoning.empty()) {
    streamReasoning_ += QString::fromStdString(d.reasoning);
    if (!thinkingClock_.isValid()) {
      thinkingClock_.start();
      thinkingTick_->start();
      render();  // the header appears at once; the tick keeps its time (and an open block's text) current
    }
  }
  QString content = QString::fromStdString(d.content);
  // Tool calls are not offered here; a model that writes one anyway shows it as plain text.
  for (const ToolCall& c : d.calls)
    content += QStringLiteral("%1(%2)").arg(QString::fromStdString(c.name), QString::fromStdString(c.arguments));
  if (content.isEmpty()) return;
  if (thinkingTick_->isActive()) {
    // The answer starts: the header says how long it thought and stops ticking.
    thinkingTick_->stop();
    thinkingMs_ = thinkingClock_.elapsed();
    streamContent_ += content;
    render();
    return;
  }
  streamContent_ += content;
  appendStreamText(content);
}

void WriteTab::appendStreamText(const QString& text) {
  if (text.isEmpty()) return;
  if (conv().mode == QLatin1String("notebook")) {
    const QSignalBlocker b(notebook_);
    QTextCursor c(notebook_->document());
    c.movePosition(QTextCursor::End);
    c.insertText(text);
    notebook_->moveCursor(QTextCursor::End);
    return;
  }
  // A new answer starts at its first word (the plain format leaves a space after "Assistant:").
  QString shown = text;
  if (streamPrefix_.isEmpty() && QStringView(streamed_).left(streamed_.size() - text.size()).trimmed().isEmpty()) {
    qsizetype i = 0;
    while (i < shown.size() && shown[i].isSpace()) ++i;
    shown = shown.mid(i);
  }
  if (shown.isEmpty()) return;
  // The streaming answer is the last paragraph of the view.
  QTextCursor c(chatView_->document());
  c.movePosition(QTextCursor::End);
  c.insertText(shown);
  chatView_->moveCursor(QTextCursor::End);
}

QString WriteTab::transcript() const {
  const Conversation& c = conversations_[current_];
  if (c.mode == QLatin1String("notebook")) return c.document;
  QString md = QStringLiteral("# %1\n\n").arg(c.title);
  if (!c.system.isEmpty()) md += QStringLiteral("**System:** %1\n\n").arg(c.system);
  for (const ChatTurn& t : c.turns) md += QStringLiteral("**%1:** %2\n\n").arg(roleTitle(t.role), t.text());
  return md;
}

bool WriteTab::saveMarkdown(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate) || f.write(transcript().toUtf8()) < 0 || !f.flush()) {
    emit statusMessage(tr("Could not save %1: %2").arg(path, f.errorString()));
    return false;
  }
  emit statusMessage(tr("Saved %1").arg(path));
  return true;
}

void WriteTab::onAnchor(const QUrl& url) {
  const QString what = url.scheme();
  const int i = url.path().toInt();
  if (i < 0 || i >= conv().turns.size()) return;
  if (what == QLatin1String("think")) {  // opens and folds the thinking, while it streams too
    if (!expanded_.remove(i)) expanded_.insert(i);
    render();
    return;
  }
  if (phase_ != Phase::Idle) return;
  ChatTurn& t = conv().turns[i];
  if (what == QLatin1String("copy")) {
    QApplication::clipboard()->setText(t.text());
  } else if (what == QLatin1String("prev") || what == QLatin1String("next")) {
    t.current = (t.current + (what == QLatin1String("next") ? 1 : -1) + t.variants.size()) % t.variants.size();
    persist();
    render();
  } else if (what == QLatin1String("edit")) {
    editTurn(i);
  }
}

void WriteTab::editTurn(int index) {
  bool ok = false;
  const QString text = QInputDialog::getMultiLineText(this, tr("Edit message"), tr("Message"), conv().turns[index].text(), &ok);
  if (ok) editMessage(index, text);
}

void WriteTab::editMessage(int index, const QString& text) {
  if (phase_ != Phase::Idle || index < 0 || index >= conv().turns.size()) return;
  // What follows an edited message no longer answers it.
  conv().turns.resize(index + 1);
  conv().turns[index].variants[conv().turns[index].current] = text;
  persist();
  render();
  start(conv().turns[index].role == QLatin1String("user") ? Action::Regenerate : Action::Continue, true);
}

// ---------------------------------------------------------------- generation

TextRequest WriteTab::baseRequest(bool interactive) {
  TextRequest r;
  r.model = model_->reference().toStdString();
  r.max_new_tokens = maxTokens_->value();
  r.sampling.temperature = static_cast<float>(temperature_->value());
  r.sampling.top_k = topK_->value();
  r.sampling.top_p = static_cast<float>(topP_->value());
  r.sampling.min_p = static_cast<float>(minP_->value());
  r.sampling.repeat_penalty = static_cast<float>(repeatPenalty_->value());
  r.sampling.seed = seed_->takeSeed();
  for (const QString& s : stops_->toPlainText().split('\n'))
    if (!s.isEmpty()) r.stop.push_back(s.toStdString());
  r.interactive = interactive;
  return r;
}

bool WriteTab::openRequest(const TextRequest& r, uint64_t seed) {
  if (phase_ != Phase::Idle) return false;
  newConversation();
  setMode(QStringLiteral("notebook"));
  conv().document = QString::fromStdString(r.prompt);
  notebook_->setPlainText(conv().document);
  model_->setReference(QString::fromStdString(r.model));
  maxTokens_->setValue(r.max_new_tokens);
  temperature_->setValue(r.sampling.temperature);
  topK_->setValue(r.sampling.top_k);
  topP_->setValue(r.sampling.top_p);
  minP_->setValue(r.sampling.min_p);
  repeatPenalty_->setValue(r.sampling.repeat_penalty);
  QStringList stops;
  for (const auto& s : r.stop) stops << QString::fromStdString(s);
  stops_->setPlainText(stops.join('\n'));
  seed_->setSeed(seed);
  openMoreIfSet();
  persist();
  render();
  return true;
}

void WriteTab::generate() { start(Action::Reply, true); }
void WriteTab::queue() { start(Action::Reply, false); }
void WriteTab::regenerate() { start(Action::Regenerate, true); }
void WriteTab::continueLast() { start(Action::Continue, true); }

void WriteTab::start(Action action, bool interactive) {
  if (phase_ != Phase::Idle) {
    emit statusMessage(tr("A generation is running: stop it first (Esc)"));
    return;
  }
  if (model_->reference().isEmpty()) {
    emit statusMessage(tr("No text model: install one (atelier models pull stories260k) or open a model folder"));
    return;
  }
  const bool notebook = conv().mode == QLatin1String("notebook");
  const QString typed = prompt_->toPlainText();
  if (notebook) {
    action = Action::Notebook;
    if (!typed.isEmpty()) {
      conv().document = notebook_->toPlainText() + typed;
      prompt_->remember(typed);
      prompt_->clear();
    } else {
      conv().document = notebook_->toPlainText();
    }
    if (conv().document.isEmpty()) {
      emit statusMessage(tr("The document is empty: write its beginning first"));
      return;
    }
  } else if (action == Action::Reply) {
    if (typed.trimmed().isEmpty()) {
      emit statusMessage(tr("Type a message first"));
      return;
    }
    conv().turns.push_back({QStringLiteral("user"), {typed}, 0, {}});
    prompt_->remember(typed);
    prompt_->clear();
    if (conv().turns.size() == 1) conv().title = typed.simplified().left(40);
  } else {
    if (conv().turns.isEmpty()) return;
    if (action == Action::Regenerate && conv().turns.back().role == QLatin1String("assistant")) {
      ChatTurn& last = conv().turns.back();
      last.variants << QString();
      last.current = static_cast<int>(last.variants.size()) - 1;
    } else if (action == Action::Continue && conv().turns.back().role != QLatin1String("assistant")) {
      action = Action::Regenerate;  // nothing to continue: answer the last message
    }
  }
  if (!notebook && (action == Action::Reply || conv().turns.back().role == QLatin1String("user")))
    conv().turns.push_back({QStringLiteral("assistant"), {QString()}, 0, {}});
  conv().model = model_->reference();
  conv().system = system_->toPlainText();
  jobConversation_ = conv().id;
  jobTurn_ = notebook ? -1 : static_cast<int>(conv().turns.size()) - 1;
  streamPrefix_ = notebook ? conv().document : conv().turns.back().text();
  streamed_.clear();
  streamReasoning_.clear();
  streamContent_.clear();
  thinkingClock_.invalidate();
  thinkingMs_ = -1;
  parser_.reset();
  tokens_ = 0;
  promptTokens_ = 0;
  finalRate_ = 0;
  firstToken_.invalidate();
  chatError_.clear();
  stopWanted_ = false;
  job_ = 0;
  early_.clear();
  setPhase(Phase::Preparing);
  persist();
  refreshConversationList();
  render();
  if (info_) {
    submitPrepared(action, interactive, *info_);
    return;
  }
  // The model's header (chat template) is still being read: submit when it is.
  auto* once = new QObject(this);
  connect(bridge_, &bridge::EngineBridge::modelInfoReady, once,
          [this, once, action, interactive](const QString& ref, bool ok, const ModelInfo& info, const QString& error) {
            if (ref != model_->reference()) return;
            once->deleteLater();
            if (stopWanted_) return finishJob(QString(), tr("stopped"));
            if (!ok) return finishJob(QString(), tr("cannot read the model: %1").arg(error), /*error=*/true);
            submitPrepared(action, interactive, info);
          });
  bridge_->requestModelInfo(model_->reference());
}

namespace {
// The model's tokenizer on its own (no weights): a GGUF holds its vocabulary,
// a llama2.c checkpoint's is a file beside it. Null when none opens.
std::shared_ptr<Vocabulary> openVocabulary(const ModelInfo& info) {
  std::vector<std::string> candidates;
  if (info.format == "llama2c") {
    const QDir dir = QFileInfo(QString::fromStdString(info.path)).dir();
    for (const char* name : {"tokenizer.bin", "tok512.bin"}) candidates.push_back(dir.filePath(QString::fromLatin1(name)).toStdString());
  } else {
    candidates.push_back(info.path);
  }
  for (const std::string& c : candidates)
    if (auto v = Vocabulary::open(c); v.ok()) return v.value();
  return nullptr;
}

// What the worker thread hands back: the fitted prompt (or why it does not fit) and the tokenizer it opened.
struct Prepared {
  Status status;
  ChatFit fit;
  bool counted = false;  // fit.prompt_tokens is the tokenizer's count
  std::shared_ptr<Vocabulary> vocab;
};
}  // namespace

void WriteTab::submitPrepared(Action action, bool interactive, const ModelInfo& info) {
  if (stopWanted_) return finishJob(QString(), tr("stopped"));
  TextRequest r = baseRequest(interactive);
  updateContextControls();
  const bool notebook = action == Action::Notebook;
  ChatFitInput in;
  in.answer_prefix = streamPrefix_.toStdString();
  in.context_tokens = notebook ? default_context_tokens(info.n_ctx_train) : contextSize_->value();
  in.max_new_tokens = r.max_new_tokens;
  in.policy = overflow_from_name(conv().overflow.toStdString());
  if (!notebook) {
    if (!conv().system.trimmed().isEmpty()) in.messages.push_back({"system", conv().system.toStdString(), ""});
    // Earlier thinking goes to the template as the message's reasoning: the template decides what stays in the prompt.
    for (int i = 0; i < jobTurn_; ++i)
      in.messages.push_back({conv().turns[i].role.toStdString(), conv().turns[i].text().toStdString(),
                             conv().turns[i].reasoningText().toStdString()});
    if (info.chat_template.empty()) r.stop.push_back("\nUser:");
  }
  const std::string document = conv().document.toStdString();
  std::shared_ptr<Vocabulary> vocab = vocabFor_ == QString::fromStdString(info.path) ? vocab_ : nullptr;
  // Counting a long conversation's tokens (perhaps more than once, as the policy drops
  // messages) is the tokenizer's work: off the UI thread.
  QtConcurrent::run([info, in, vocab, notebook, document]() {
    Prepared p;
    p.vocab = vocab ? vocab : openVocabulary(info);
    const TokenCounter count = [v = p.vocab](const std::string& prompt, bool add_bos) -> Result<int> {
      auto ids = v->tokenize(prompt, add_bos, /*parse_special=*/true);
      if (!ids.ok()) return ids.status();
      return static_cast<int>(ids->size());
    };
    if (notebook) {
      p.fit.prompt = document;
      p.fit.max_new_tokens = in.max_new_tokens;
      if (p.vocab) {
        auto n = count(document, true);
        p.counted = n.ok();
        if (n.ok()) p.fit.prompt_tokens = n.value();
      }
      return p;
    }
    if (!p.vocab) {
      // No tokenizer of its own (a store's llama2.c model): the whole conversation, and the engine says if it does not fit.
      ChatFitInput all = in;
      all.context_tokens = INT32_MAX / 2;
      auto fit = fit_chat(info, all, [](const std::string& prompt, bool) -> Result<int> { return static_cast<int>(prompt.size() / 4); });
      if (fit.ok()) p.fit = fit.value(), p.fit.max_new_tokens = in.max_new_tokens;
      else p.status = fit.status();
      return p;
    }
    auto fit = fit_chat(info, in, count);
    if (fit.ok()) {
      p.fit = fit.value();
      p.counted = true;
    } else {
      p.status = fit.status();
    }
    return p;
  }).then(this, [this, r, notebook, path = QString::fromStdString(info.path), policy = conv().overflow,
                 syntax = detect_chat_syntax(info.chat_template)](Prepared p) mutable {
    if (p.vocab) {
      vocab_ = p.vocab;
      vocabFor_ = path;
    }
    if (stopWanted_) return finishJob(QString(), tr("stopped"));
    if (!p.status.ok()) return finishJob(QString(), QString::fromStdString(p.status.message), /*error=*/true);
    r.prompt = p.fit.prompt;
    r.add_bos = p.fit.add_bos;
    r.max_new_tokens = p.fit.max_new_tokens;
    promptTokens_ = p.counted ? p.fit.prompt_tokens : 0;
    // A new answer of a thinking model is taken apart as it streams (Continue writes on plain text).
    parser_.reset();
    if (!notebook && streamPrefix_.isEmpty() && (syntax.think_tags || syntax.harmony)) {
      syntax_ = syntax;
      parseOptions_ = ChatOutputOptions{};
      parseOptions_.starts_in_reasoning = prompt_opens_reasoning(syntax, r.prompt);
      parser_ = std::make_unique<ChatOutputParser>(syntax_, parseOptions_);
    }
    if (p.fit.dropped_messages > 0)
      emit statusMessage(tr("Write: %n earlier message(s) left out to fit the context (%1)", nullptr, p.fit.dropped_messages).arg(policy));
    submitFitted(std::move(r));
  });
}

void WriteTab::submitFitted(TextRequest r) {
  promptBytes_ = static_cast<int>(r.prompt.size());
  bridge_->submitText(r, [this](Result<JobId> id) {
    if (!id.ok()) return finishJob(QString(), QString::fromStdString(id.status().message), /*error=*/true);
    job_ = id.value();
    if (phase_ == Phase::Preparing) setPhase(Phase::Queued);
    if (stopWanted_) {
      setPhase(Phase::Stopping);
      bridge_->cancel(job_);
    }
    // Events of this job that came before its id did.
    const QVector<Event> early = std::exchange(early_, {});
    for (const Event& ev : early)
      if (ev.job == job_) onEvent(ev);
  });
}

void WriteTab::stop() {
  switch (phase_) {
    case Phase::Idle:
    case Phase::Stopping:
      return;
    case Phase::Preparing:
      // No job id yet: cancel it the moment it exists.
      stopWanted_ = true;
      setPhase(Phase::Stopping);
      return;
    default:
      setPhase(Phase::Stopping);
      bridge_->cancel(job_, [this](Status s) {
        // Already finished: the terminal event ends the phase.
        if (!s.ok()) emit statusMessage(QString::fromStdString(s.message));
      });
  }
}

void WriteTab::onEvent(const Event& ev) {
  if (job_ == 0 && (phase_ == Phase::Preparing || phase_ == Phase::Stopping) && early_.size() < 10000) early_.push_back(ev);
  if (job_ == 0 || ev.job != job_) return;
  switch (ev.type) {
    case EventType::Started:
      if (phase_ == Phase::Queued) setPhase(Phase::Loading);
      break;
    case EventType::Token: {
      if (phase_ == Phase::Queued || phase_ == Phase::Loading) {
        setPhase(Phase::Decoding);
        firstToken_.start();
      }
      tokens_ = ev.index + 1;
      const QString text = QString::fromStdString(ev.text);
      streamed_ += text;
      if (parser_) takeDelta(parser_->push(ev.text));
      else appendStreamText(text);
      updateStats();
      break;
    }
    case EventType::Completed: {
      tokens_ = static_cast<int>(ev.result.ids.size());
      promptTokens_ = static_cast<int>(ev.result.prompt_ids.size());
      finalRate_ = ev.result.stats.new_tokens_per_s;
      QString note = tr("%1 tokens, %2 tokens/s, stop: %3")
                         .arg(tokens_)
                         .arg(ev.result.stats.new_tokens_per_s, 0, 'f', 1)
                         .arg(QString::fromStdString(ev.result.stats.stop_reason));
      finishJob(QString::fromStdString(ev.result.text), note);
      break;
    }
    case EventType::Failed:
      finishJob(streamed_, tr("failed: %1").arg(QString::fromStdString(ev.message)), /*error=*/true);
      break;
    case EventType::Cancelled:
      finishJob(streamed_, tr("stopped"));
      break;
    default:
      break;
  }
}

void WriteTab::finishJob(const QString& finalText, const QString& note, bool error) {
  // The answer belongs to the conversation it was asked in (the user cannot switch meanwhile).
  for (Conversation& c : conversations_) {
    if (c.id != jobConversation_) continue;
    if (c.mode == QLatin1String("notebook")) c.document = streamPrefix_ + finalText;
    else if (jobTurn_ >= 0 && jobTurn_ < c.turns.size()) {
      ChatTurn& t = c.turns[jobTurn_];
      QString text = finalText;
      QString reasoning;
      if (parser_) {  // the whole answer taken apart again: the stream's pieces may have stopped mid-marker
        ChatOutputParser whole(syntax_, parseOptions_);
        ChatDelta a = whole.push(finalText.toStdString());
        const ChatDelta b = whole.finish();
        a.reasoning += b.reasoning;
        a.content += b.content;
        for (const ToolCall& call : b.calls) a.calls.push_back(call);
        for (const ToolCall& call : a.calls) a.content += call.name + "(" + call.arguments + ")";
        text = QString::fromStdString(a.content);
        reasoning = QString::fromStdString(a.reasoning);
      }
      // A new answer starts at its first word (the plain format leaves a space after "Assistant:").
      if (streamPrefix_.isEmpty()) {
        qsizetype i = 0;
        while (i < text.size() && text[i].isSpace()) ++i;
        text = text.mid(i);
      }
      t.variants[t.current] = streamPrefix_ + text;
      while (t.reasoning.size() < t.variants.size()) t.reasoning << QString();
      if (parser_) t.reasoning[t.current] = reasoning;
      // An answer that never started leaves no empty variant, and no empty bubble, behind.
      if (t.text().isEmpty() && t.reasoningText().isEmpty() && t.variants.size() > 1) {
        t.variants.removeAt(t.current);
        t.reasoning.removeAt(t.current);
        t.current = static_cast<int>(t.variants.size()) - 1;
      } else if (t.text().isEmpty() && t.reasoningText().isEmpty()) {
        c.turns.removeAt(jobTurn_);
      }
    }
  }
  // An error belongs in the chat, where the answer would have been.
  chatError_ = error ? note : QString();
  thinkingTick_->stop();
  parser_.reset();
  job_ = 0;
  jobTurn_ = -1;
  setPhase(Phase::Idle);
  persist();
  render();
  updateStats();
  emit statusMessage(tr("Write: %1").arg(note));
}

void WriteTab::setPhase(Phase p) {
  phase_ = p;
  const bool idle = p == Phase::Idle;
  generateButton_->setEnabled(idle);
  queueButton_->setEnabled(idle);
  regenerateButton_->setEnabled(idle && conv().mode == QLatin1String("chat"));
  continueButton_->setEnabled(idle);
  stopButton_->setEnabled(!idle && p != Phase::Stopping);
  if (stopKey_) stopKey_->setEnabled(!idle);  // idle, Esc is left to whatever has focus
  notebook_->setReadOnly(!idle);
  mode_->setEnabled(idle);
  static const char* names[] = {"", "preparing...", "queued (or loading the model)...", "reading the prompt...", "writing...", "stopping..."};
  phaseLabel_->setText(p == Phase::Queued && bridge_->paused() ? tr("queued: the queue is paused (Queue > Pause / resume)")
                                                               : tr(names[static_cast<int>(p)]));
  emit phaseChanged(p);
}

void WriteTab::updateStats() {
  const double seconds = firstToken_.isValid() ? firstToken_.elapsed() / 1000.0 : 0;
  // Once the job is done, its result's rate: the same figure the finished note gives.
  double rate = seconds > 0.05 && tokens_ > 1 ? (tokens_ - 1) / seconds : 0;
  if (phase_ == Phase::Idle && finalRate_ > 0) rate = finalRate_;
  // Until the result gives the exact count, the prompt is estimated at 4 bytes per token.
  int prompt = promptTokens_;
  if (prompt == 0 && phase_ != Phase::Idle) prompt = promptBytes_ / 4;
  QString text = (rate > 0 ? tr("%1 tokens/s").arg(rate, 0, 'f', 1) : tr("– tokens/s")) + tr(" · %1 tokens").arg(tokens_);
  if (contextTokens_ > 0) text += tr(" · context %1/%2").arg(prompt + tokens_).arg(contextTokens_);
  emit statsChanged(text);
}

void WriteTab::persist() {
  if (store_) store_->save(conv());
}

void WriteTab::saveSettings(QSettings& s) const {
  s.beginGroup(QStringLiteral("write"));
  s.setValue(QStringLiteral("model"), model_->reference());
  s.setValue(QStringLiteral("temperature"), temperature_->value());
  s.setValue(QStringLiteral("topK"), topK_->value());
  s.setValue(QStringLiteral("topP"), topP_->value());
  s.setValue(QStringLiteral("minP"), minP_->value());
  s.setValue(QStringLiteral("repeatPenalty"), repeatPenalty_->value());
  s.setValue(QStringLiteral("maxTokens"), maxTokens_->value());
  s.setValue(QStringLiteral("stops"), stops_->toPlainText());
  s.setValue(QStringLiteral("seed"), QString::number(seed_->seed()));
  s.setValue(QStringLiteral("seedLocked"), seed_->locked());
  s.setValue(QStringLiteral("history"), prompt_->history());
  s.setValue(QStringLiteral("conversation"), conversations_[current_].id);
  s.endGroup();
}

// A folded setting that is not the default is shown, not hidden behind "More".
void WriteTab::openMoreIfSet() {
  if (repeatPenalty_->value() != 1.0 || !stops_->toPlainText().trimmed().isEmpty() || seed_->locked()) moreFold_->setOpen(true);
}

void WriteTab::loadSettings(QSettings& s) {
  s.beginGroup(QStringLiteral("write"));
  if (s.contains(QStringLiteral("model"))) model_->setPreferred(s.value(QStringLiteral("model")).toString());
  temperature_->setValue(s.value(QStringLiteral("temperature"), temperature_->value()).toDouble());
  topK_->setValue(s.value(QStringLiteral("topK"), topK_->value()).toInt());
  topP_->setValue(s.value(QStringLiteral("topP"), topP_->value()).toDouble());
  minP_->setValue(s.value(QStringLiteral("minP"), minP_->value()).toDouble());
  repeatPenalty_->setValue(s.value(QStringLiteral("repeatPenalty"), repeatPenalty_->value()).toDouble());
  maxTokens_->setValue(s.value(QStringLiteral("maxTokens"), maxTokens_->value()).toInt());
  stops_->setPlainText(s.value(QStringLiteral("stops")).toString());
  if (s.contains(QStringLiteral("seed"))) {
    seed_->setSeed(s.value(QStringLiteral("seed")).toString().toULongLong());
    seed_->setLocked(s.value(QStringLiteral("seedLocked")).toBool());
  }
  openMoreIfSet();
  prompt_->setHistory(s.value(QStringLiteral("history")).toStringList());
  const qint64 id = s.value(QStringLiteral("conversation")).toLongLong();
  for (int i = 0; i < conversations_.size(); ++i)
    if (conversations_[i].id == id) {
      conversationList_->setCurrentRow(i);
      selectConversation(i);
    }
  s.endGroup();
}

}  // namespace atelier::ui
