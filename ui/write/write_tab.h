// The Write workspace: Chat (a conversation rendered with the model's chat
// template) and Notebook (raw completion that continues the document), a
// prompt editor, token-by-token output and the sampling parameters.
#pragma once

#include <QElapsedTimer>
#include <QPlainTextEdit>
#include <QPointer>
#include <QSet>
#include <QWidget>

#include <atelier/chat.h>

#include <memory>
#include <optional>

#include "bridge/engine_bridge.h"
#include "write/conversation_store.h"

class QComboBox;
class QShortcut;
class QFormLayout;
class QDoubleSpinBox;
class QLabel;
class QListWidget;
class QPushButton;
class QSettings;
class QSpinBox;
class QStackedWidget;
class QTextBrowser;
class QTimer;

namespace atelier::ui {

class FoldSection;

class ModelPicker;
class SeedBox;

// The prompt box: Ctrl+Enter generates, Ctrl+Shift+Enter queues, Esc stops,
// Ctrl+Up/Down walk through earlier prompts.
class PromptEdit : public QPlainTextEdit {
  Q_OBJECT
 public:
  using QPlainTextEdit::QPlainTextEdit;
  void remember(const QString& prompt);
  QStringList history() const { return history_; }
  void setHistory(const QStringList& h) { history_ = h; cursor_ = static_cast<int>(h.size()); }
 signals:
  void generateRequested();
  void queueRequested();
  void stopRequested();

 protected:
  void keyPressEvent(QKeyEvent* event) override;

 private:
  QStringList history_;
  int cursor_ = 0;
};

class WriteTab : public QWidget {
  Q_OBJECT

 public:
  // What the current generation is doing, for Stop and the status bar.
  enum class Phase { Idle, Preparing, Queued, Loading, Decoding, Stopping };
  Q_ENUM(Phase)

  WriteTab(bridge::EngineBridge* bridge, ConversationStore* store, QWidget* parent = nullptr);
  ~WriteTab() override;

  Phase phase() const { return phase_; }
  atelier::JobId currentJob() const { return job_; }
  QString transcript() const;  // the conversation or document as Markdown
  const Conversation& conversation() const { return conversations_[current_]; }
  void saveSettings(QSettings& settings) const;
  void loadSettings(QSettings& settings);

 public slots:
  void generate();         // now (interactive)
  void queue();            // behind other jobs (not interactive)
  void stop();
  void regenerate();       // a new variant of the last answer
  void continueLast();     // the model continues the last answer / the document
  void newConversation();
  void setMode(const QString& mode);  // "chat" or "notebook"
  bool saveMarkdown(const QString& path);
  // A finished job again (History): a new notebook holding exactly the prompt
  // the model saw, with the job's model, sampling and (locked) seed. False while generating.
  bool openRequest(const atelier::TextRequest& request, uint64_t seed);
  // Replaces message INDEX, drops what followed it and continues from there:
  // a user message gets a new answer, an assistant message is written on.
  void editMessage(int index, const QString& text);

 signals:
  void statsChanged(const QString& text);   // tokens/s, tokens, context
  void statusMessage(const QString& text);
  void phaseChanged(atelier::ui::WriteTab::Phase phase);

 private:
  enum class Action { Reply, Regenerate, Continue, Notebook };
  void start(Action action, bool interactive);
  void submitPrepared(Action action, bool interactive, const atelier::ModelInfo& info);
  void submitFitted(atelier::TextRequest request);
  void updateContextControls();  // the context size's range and its KV cost, for the model and conversation
  void onEvent(const atelier::Event& event);
  void finishJob(const QString& finalText, const QString& note, bool error = false);
  void setPhase(Phase p);
  void render();  // the whole conversation into the view
  void appendStreamText(const QString& text);
  void takeDelta(const atelier::ChatDelta& d);  // a thinking model's answer as it streams
  QString thinkingHeader(int turn, bool streaming) const;
  void onAnchor(const QUrl& url);
  void editTurn(int index);
  void selectConversation(int row);
  void refreshConversationList();
  void persist();
  void openMoreIfSet();
  void updateStats();
  void updateTemplateNote();
  atelier::TextRequest baseRequest(bool interactive);
  Conversation& conv() { return conversations_[current_]; }

  bridge::EngineBridge* bridge_;
  ConversationStore* store_;
  QVector<Conversation> conversations_;
  int current_ = 0;

  QFormLayout* form_;
  QComboBox* mode_;
  QListWidget* conversationList_;
  ModelPicker* model_;
  QPlainTextEdit* system_;
  QDoubleSpinBox* temperature_;
  QSpinBox* topK_;
  QDoubleSpinBox* topP_;
  QDoubleSpinBox* minP_;
  QDoubleSpinBox* repeatPenalty_;
  QSpinBox* maxTokens_;
  QSpinBox* contextSize_;
  QComboBox* overflow_;
  QLabel* contextNote_;
  QPlainTextEdit* stops_;
  SeedBox* seed_;
  FoldSection* moreFold_;  // repeat penalty, stop strings, seed
  QLabel* templateNote_;
  QStackedWidget* views_;
  QTextBrowser* chatView_;
  QPlainTextEdit* notebook_;
  PromptEdit* prompt_;
  QPushButton* generateButton_;
  QPushButton* queueButton_;
  QPushButton* stopButton_;
  QPushButton* regenerateButton_;
  QPushButton* continueButton_;
  QPushButton* copyButton_;
  QPushButton* saveButton_;
  QLabel* phaseLabel_;
  QShortcut* stopKey_ = nullptr;  // Esc, window-wide while a generation runs

  // The generation in flight.
  Phase phase_ = Phase::Idle;
  atelier::JobId job_ = 0;
  bool stopWanted_ = false;          // Stop pressed before the job id was known
  QVector<atelier::Event> early_;    // events that came before the job id did
  qint64 jobConversation_ = 0;       // the conversation the answer belongs to
  int jobTurn_ = -1;                 // the assistant turn being written (chat)
  QString streamPrefix_;             // text the answer continues (Continue)
  QString streamed_;                 // text received so far
  QString chatError_;                // shown under the conversation until the next generation
  double finalRate_ = 0;             // the finished job's tokens/s, as its result reports it
  int tokens_ = 0;
  int promptTokens_ = 0;             // exact, from the result
  int promptBytes_ = 0;              // the submitted prompt's size: the estimate until then
  int contextTokens_ = 0;
  QElapsedTimer firstToken_;
  // A thinking model's answer (its template has <think> or gpt-oss's channels):
  // parsed as it streams; the reasoning shows folded under a header (its
  // elapsed time while it streams), click to open; the content below it.
  std::unique_ptr<atelier::ChatOutputParser> parser_;
  atelier::ChatSyntax syntax_;
  atelier::ChatOutputOptions parseOptions_;
  QString streamReasoning_, streamContent_;
  QElapsedTimer thinkingClock_;     // from the reasoning's first piece
  qint64 thinkingMs_ = -1;          // how long it thought, once the answer started
  QTimer* thinkingTick_ = nullptr;  // redraws the header's time while thinking
  QSet<int> expanded_;              // turns whose thinking is open (this conversation)
  std::optional<atelier::ModelInfo> info_;  // of model_->reference()
  QString infoFor_;
  std::shared_ptr<atelier::Vocabulary> vocab_;  // of info_'s model: counts prompts as the engine does
  QString vocabFor_;
};

}  // namespace atelier::ui
