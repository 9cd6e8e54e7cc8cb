// The Write tab driven as a person would (keys and clicks, offscreen): tokens
// stream into the view, the notebook continues a document exactly as the
// reference model does, Stop works in every state, variants are kept, and
// a conversation is still there after a restart.
#include <QApplication>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLabel>
#include <QListWidget>
#include <QRegularExpression>
#include <QPushButton>
#include <QSpinBox>
#include <QSignalSpy>
#include <QTextBrowser>
#include <QtTest>

#include <atelier/models.h>

#include <cstring>
#include <memory>

#include "common/model_picker.h"
#include "common/seed_box.h"
#include "ui/ui_test_util.h"
#include "write/context_fit.h"
#include "write/conversation_store.h"
#include "write/write_tab.h"

using namespace atelier;
using namespace atelier::ui;

class WriteTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;
  std::unique_ptr<bridge::EngineBridge> bridge_;
  std::unique_ptr<ConversationStore> store_;
  std::unique_ptr<WriteTab> tab_;
  QString slowModel_;  // a 15M-parameter synthetic model: slow enough to catch every phase

  template <class T>
  T* child(const char* name) {
    T* w = tab_->findChild<T*>(QString::fromLatin1(name));
    if (!w) qFatal("no widget %s", name);
    return w;
  }

  void openTab() {
    store_ = std::make_unique<ConversationStore>(home_->home());
    tab_ = std::make_unique<WriteTab>(bridge_.get(), store_.get());
    tab_->resize(1000, 700);
    tab_->show();
    // Shortcuts answer only in the active window, as on a desktop.
    tab_->activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(tab_.get()));
    bridge_->scanModels();
    QTRY_VERIFY_WITH_TIMEOUT(child<ModelPicker>("writeModel")->count() > 0, 20000);
  }

  void useModel(const QString& ref) {
    auto* picker = child<ModelPicker>("writeModel");
    picker->setReference(ref);
    QTRY_VERIFY_WITH_TIMEOUT(!child<QLabel>("templateNote")->text().startsWith(QStringLiteral("Reading")), 30000);
  }

  void waitIdle(int ms = 60000) { QTRY_VERIFY_WITH_TIMEOUT(tab_->phase() == WriteTab::Phase::Idle, ms); }

  JobInfo lastJob() {
    JobInfo out;
    bridge_->refreshJobs();
    QTest::qWait(300);
    const auto jobs = bridge_->jobs();
    return jobs.isEmpty() ? out : jobs.front();
  }

 private slots:
  void initTestCase() {
    home_ = std::make_unique<uitest::TestHome>();
    QVERIFY(home_->pull({QStringLiteral("stories260k")}));
    slowModel_ = home_->synthText(QStringLiteral("m15.gguf"));
    QVERIFY(!slowModel_.isEmpty());
    bridge::EngineBridge::Options o;
    o.dataDir = home_->home();
    o.modelFolders = {home_->path(QString())};  // the synthetic model's folder
    bridge_ = std::make_unique<bridge::EngineBridge>(o);
    QSignalSpy opened(bridge_.get(), &bridge::EngineBridge::opened);
    bridge_->start();
    QVERIFY(opened.wait(20000));
    QVERIFY(opened.front().at(0).toBool());
    QVERIFY(opened.front().at(1).toBool());  // this process runs the queue
    openTab();
  }

  // Chat: typed, Ctrl+Enter, tokens arrive one by one into the view.
  void tokensStreamIntoChat() {
    useModel(QStringLiteral("stories260k"));
    QVERIFY(child<QLabel>("templateNote")->text().contains(QStringLiteral("no chat template")));
    child<QSpinBox>("maxTokens")->setValue(40);
    auto* view = child<QTextBrowser>("chatView");
    QVector<int> lengths;
    QObject scope;  // disconnects the lambda when this test returns, even early
    connect(bridge_.get(), &bridge::EngineBridge::event, &scope, [&](const Event& ev) {
      if (ev.type == EventType::Token) lengths << view->toPlainText().size();
    });
    auto* prompt = child<PromptEdit>("prompt");
    prompt->setFocus();
    QTest::keyClicks(prompt, QStringLiteral("Tell me a story about a cat"));
    QTest::keyClick(prompt, Qt::Key_Return, Qt::ControlModifier);
    QVERIFY(tab_->phase() != WriteTab::Phase::Idle);
    QVERIFY(prompt->toPlainText().isEmpty());
    waitIdle();
    QVERIFY2(lengths.size() >= 10, qPrintable(QString::number(lengths.size())));
    // The view grew while the tokens came, not only at the end.
    QVERIFY(std::adjacent_find(lengths.begin(), lengths.end(), std::greater<int>()) == lengths.end());
    QVERIFY(lengths.back() > lengths.front());
    const Conversation& c = tab_->conversation();
    QCOMPARE(c.turns.size(), 2);
    QCOMPARE(c.turns[0].text(), QStringLiteral("Tell me a story about a cat"));
    QVERIFY(!c.turns[1].text().isEmpty());
    // A paragraph's trailing newline is not part of what the view shows
    // (QTextDocument drops it), so the reply is looked for without it.
    QVERIFY(view->toPlainText().contains(c.turns[1].text().trimmed()));
    // The job the engine ran was the plain User:/Assistant: format.
    const JobInfo job = lastJob();
    QCOMPARE(job.state, JobState::Completed);
    QVERIFY(QString::fromStdString(job.request.prompt).contains(QStringLiteral("User: Tell me a story about a cat")));
    // The answer as the model wrote it, without the space the plain format's "Assistant:" leaves before it.
    QVERIFY2(!c.turns[1].text().front().isSpace(), qPrintable(c.turns[1].text()));
    QCOMPARE(QString::fromStdString(job.text).trimmed(), c.turns[1].text().trimmed());
  }

  // Regenerate keeps the first answer as a variant; < > cycles.
  void regenerateKeepsVariants() {
    const QString first = tab_->conversation().turns[1].text();
    QTest::mouseClick(child<QPushButton>("regenerate"), Qt::LeftButton);
    waitIdle();
    const ChatTurn& t = tab_->conversation().turns[1];
    QCOMPARE(t.variants.size(), 2);
    QCOMPARE(t.variants[0], first);
    QCOMPARE(t.current, 1);
    QVERIFY(child<QTextBrowser>("chatView")->toPlainText().contains(QStringLiteral("2/2")));
    emit child<QTextBrowser>("chatView")->anchorClicked(QUrl(QStringLiteral("prev:1")));
    QCOMPARE(tab_->conversation().turns[1].current, 0);
    QVERIFY(child<QTextBrowser>("chatView")->toPlainText().contains(QStringLiteral("1/2")));
  }

  // Editing the question drops the answers after it and answers the new one;
  // editing an answer continues it from the edited text.
  void editAndContinue() {
    tab_->editMessage(0, QStringLiteral("Tell me about a dog"));
    waitIdle();
    const Conversation& c = tab_->conversation();
    QCOMPARE(c.turns.size(), 2);
    QCOMPARE(c.turns[0].text(), QStringLiteral("Tell me about a dog"));
    QCOMPARE(lastJob().request.prompt.find("User: Tell me about a dog\nAssistant:") != std::string::npos, true);
    tab_->editMessage(1, QStringLiteral("Once upon a time"));
    waitIdle();
    QVERIFY(tab_->conversation().turns[1].text().startsWith(QStringLiteral("Once upon a time")));
    // The job continued the edited answer: its prompt ends with it.
    QVERIFY(QString::fromStdString(lastJob().request.prompt).endsWith(QStringLiteral("Assistant: Once upon a time")));
  }

  // Ctrl+Up / Ctrl+Down walk through the prompts sent before.
  void promptHistory() {
    auto* prompt = child<PromptEdit>("prompt");
    prompt->setFocus();
    prompt->clear();
    QTest::keyClick(prompt, Qt::Key_Up, Qt::ControlModifier);
    QCOMPARE(prompt->toPlainText(), QStringLiteral("Tell me a story about a cat"));  // the last one sent
    QTest::keyClick(prompt, Qt::Key_Down, Qt::ControlModifier);
    QCOMPARE(prompt->toPlainText(), QString());
  }

  // Notebook: greedy continuation of "Once upon a time" is the reference
  // implementation's golden text (fixtures), byte for byte.
  void notebookContinuesTheDocument() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("notebook"));
    child<QDoubleSpinBox>("temperature")->setValue(0);
    child<QSpinBox>("maxTokens")->setValue(60);
    auto* doc = child<QPlainTextEdit>("notebook");
    doc->setFocus();
    QTest::keyClicks(doc, QStringLiteral("Once upon a time"));
    QTest::mouseClick(child<QPushButton>("generate"), Qt::LeftButton);
    waitIdle();
    QFile golden(uitest::fixtures() + QStringLiteral("/text/golden-once-upon-a-time-greedy.txt"));
    QVERIFY(golden.open(QIODevice::ReadOnly));
    QString expected = QString::fromUtf8(golden.readAll());
    expected.chop(1);  // the file's final newline
    QCOMPARE(doc->toPlainText(), expected);
    QCOMPARE(tab_->conversation().document, expected);
  }

  // Stop in every state: queued, preparing (before the job exists), loading, decoding.
  void stopWhileQueued() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(slowModel_);
    child<QSpinBox>("maxTokens")->setValue(250);  // m15.gguf holds 256 tokens
    bridge_->setPaused(true);
    QTest::qWait(300);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("hello"));
    tab_->generate();
    QTRY_COMPARE_WITH_TIMEOUT(tab_->phase(), WriteTab::Phase::Queued, 10000);
    QTest::keyClick(child<PromptEdit>("prompt"), Qt::Key_Escape);
    QCOMPARE(tab_->phase(), WriteTab::Phase::Stopping);
    QCOMPARE(child<QLabel>("writePhase")->text(), QStringLiteral("stopping..."));
    waitIdle(20000);
    QCOMPARE(lastJob().state, JobState::Cancelled);
    bridge_->setPaused(false);
  }

  void stopWhilePreparing() {
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("hello again"));
    tab_->generate();
    QCOMPARE(tab_->phase(), WriteTab::Phase::Preparing);
    tab_->stop();
    QCOMPARE(tab_->phase(), WriteTab::Phase::Stopping);
    waitIdle(20000);
    const JobInfo j = lastJob();
    QCOMPARE(j.state, JobState::Cancelled);
    QCOMPARE(j.stats.new_tokens, 0);
  }

  void stopWhileLoadingAndDecoding_data() {
    QTest::addColumn<int>("phase");
    QTest::newRow("loading") << int(WriteTab::Phase::Loading);
    QTest::newRow("decoding") << int(WriteTab::Phase::Decoding);
  }
  void stopWhileLoadingAndDecoding() {
    QFETCH(int, phase);
    bool seen = false;
    QObject scope;  // disconnects the lambda when this test returns, even early
    connect(tab_.get(), &WriteTab::phaseChanged, &scope, [&](WriteTab::Phase p) {
      if (int(p) == phase && !seen) {
        seen = true;
        tab_->stop();
      }
    });
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("and again"));
    tab_->generate();
    waitIdle(60000);
    QVERIFY(seen);
    const JobInfo j = lastJob();
    QCOMPARE(j.state, JobState::Cancelled);
    QVERIFY(j.stats.new_tokens < 400);
  }

  // Esc stops a generation whatever widget has focus: after a click on
  // Regenerate the button is disabled and focus moves on (to Copy), where
  // Esc used to be ignored and the answer ran to its end.
  void escStopsWhateverHasFocus() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(slowModel_);
    child<QSpinBox>("maxTokens")->setValue(250);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("hi"));
    tab_->generate();
    waitIdle();
    for (const char* button : {"regenerate", "generate"}) {
      if (QByteArray(button) == "generate") {
        // A new chat: the first one's 250-token answer would not leave this one room in the model's 256 tokens.
        tab_->newConversation();
        child<PromptEdit>("prompt")->setPlainText(QStringLiteral("once more"));
      }
      QTest::mouseClick(child<QPushButton>(button), Qt::LeftButton);
      QTRY_COMPARE_WITH_TIMEOUT(tab_->phase(), WriteTab::Phase::Decoding, 30000);
      QWidget* focus = QApplication::focusWidget();
      QVERIFY(focus);
      QVERIFY2(focus != child<PromptEdit>("prompt"), focus->objectName().toLatin1());  // the case the prompt's own Esc missed
      QTest::keyClick(focus, Qt::Key_Escape);
      QCOMPARE(tab_->phase(), WriteTab::Phase::Stopping);
      waitIdle(20000);
      const JobInfo j = lastJob();
      QCOMPARE(j.state, JobState::Cancelled);
      QVERIFY2(j.stats.new_tokens < 250, qPrintable(QString::number(j.stats.new_tokens)));
    }
  }

  // A message longer than the context: the error is shown in the chat
  // itself, and no empty Assistant bubble is left behind.
  void contextErrorShowsInTheChat() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(QStringLiteral("stories260k"));
    child<QSpinBox>("maxTokens")->setValue(16);
    QString longText;
    while (longText.size() < 12000) longText += QStringLiteral("The little cat ran to the big red house and sat in the sun. ");
    child<PromptEdit>("prompt")->setPlainText(longText);
    tab_->generate();
    waitIdle();
    const Conversation& c = tab_->conversation();
    QCOMPARE(c.turns.size(), 1);  // the message stays; no empty answer after it
    QCOMPARE(c.turns[0].role, QStringLiteral("user"));
    const QString shown = child<QTextBrowser>("chatView")->toPlainText();
    QVERIFY2(shown.contains(QStringLiteral("context holds")), qPrintable(shown.right(300)));
  }

  // Each overflow policy applied before submitting, checked against the real
  // tokenizer (stories260K's SentencePiece vocabulary) and against the
  // engine's own count of the job's prompt.
  void overflowPolicies_data() {
    QTest::addColumn<QString>("policy");
    QTest::newRow("truncate-middle") << QStringLiteral("truncate-middle");
    QTest::newRow("rolling-window") << QStringLiteral("rolling-window");
    QTest::newRow("stop-at-limit") << QStringLiteral("stop-at-limit");
  }
  void overflowPolicies() {
    QFETCH(QString, policy);
    auto vocab = Vocabulary::open((uitest::fixtures() + QStringLiteral("/text/stories260K.gguf")).toStdString());
    QVERIFY(vocab.ok());
    auto tokens = [&](const std::string& text, bool bos) { return static_cast<int>(vocab.value()->tokenize(text, bos, true).value().size()); };
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(QStringLiteral("stories260k"));
    auto* context = tab_->findChild<QSpinBox*>(QStringLiteral("contextSize"));
    auto* overflow = tab_->findChild<QComboBox*>(QStringLiteral("overflowPolicy"));
    QVERIFY2(context && overflow, "no context size or overflow policy in the Write panel");
    QCOMPARE(context->maximum(), 2048);  // the model's training context
    context->setValue(160);
    // Its KV cache at f16: 2 x 5 layers x 4 KV heads x 8 dims x 2 bytes = 640 bytes a token.
    QVERIFY2(tab_->findChild<QLabel*>(QStringLiteral("contextNote"))->text().contains(QStringLiteral("100 KiB")),
             qPrintable(tab_->findChild<QLabel*>(QStringLiteral("contextNote"))->text()));
    overflow->setCurrentIndex(overflow->findData(policy));
    QVERIFY(overflow->currentIndex() >= 0);
    child<QPlainTextEdit>("systemPrompt")->setPlainText(QStringLiteral("Tell short stories."));
    child<QDoubleSpinBox>("temperature")->setValue(0);
    child<QSpinBox>("maxTokens")->setValue(24);
    const QStringList asks = {QStringLiteral("First: a cat."), QStringLiteral("Second: a dog."), QStringLiteral("Third: a bird."),
                              QStringLiteral("Fourth: a fish."), QStringLiteral("Fifth: a frog."), QStringLiteral("Sixth: a bee.")};
    bool overflowed = false;
    for (const QString& ask : asks) {
      child<PromptEdit>("prompt")->setPlainText(ask);
      tab_->generate();
      waitIdle();
      const JobInfo j = lastJob();
      const Conversation& c = tab_->conversation();
      if (policy == QStringLiteral("stop-at-limit") && j.request.prompt.find(ask.toStdString()) == std::string::npos) {
        // Refused before submitting: said in the chat, the message kept, no empty answer.
        overflowed = true;
        QCOMPARE(c.turns.back().role, QStringLiteral("user"));
        QCOMPARE(c.turns.back().text(), ask);
        QVERIFY(child<QTextBrowser>("chatView")->toPlainText().contains(QStringLiteral("context holds 160")));
        break;
      }
      QCOMPARE(j.state, JobState::Completed);
      const int n = tokens(j.request.prompt, j.request.add_bos);
      QCOMPARE(n, j.stats.prompt_tokens);  // the engine counted the same prompt
      QVERIFY2(n + j.request.max_new_tokens <= 160, qPrintable(QStringLiteral("%1 + %2").arg(n).arg(j.request.max_new_tokens)));
      const QString prompt = QString::fromStdString(j.request.prompt);
      QVERIFY(prompt.startsWith(QStringLiteral("System: Tell short stories.")));  // kept by every policy
      QVERIFY(prompt.endsWith(QStringLiteral("User: %1\nAssistant:").arg(ask)));
      const bool dropped = !prompt.contains(QStringLiteral("User: Second: a dog."));
      if (ask != asks[0] && ask != asks[1] && dropped) {
        overflowed = true;
        // Truncate-middle keeps the first exchange; a rolling window lets it go first.
        QCOMPARE(prompt.contains(QStringLiteral("User: First: a cat.")), policy == QStringLiteral("truncate-middle"));
        QVERIFY(c.turns.size() > 4);  // the conversation itself keeps everything
      }
      if (policy == QStringLiteral("stop-at-limit")) QVERIFY(!dropped || ask == asks[0]);
      QVERIFY(!c.turns.back().text().isEmpty());
    }
    QVERIFY2(overflowed, "the conversation never passed its context");
  }

  // The policies on their own, against stories260K's real tokenizer: the count
  // is the tokenizer's, what stays is what each policy promises, and the answer
  // never gets more room than the context has left.
  void fitChatUnderEachPolicy() {
    const std::string path = (uitest::fixtures() + QStringLiteral("/text/stories260K.gguf")).toStdString();
    auto vocab = Vocabulary::open(path);
    auto info = read_model_info(path);
    QVERIFY(vocab.ok() && info.ok());
    const TokenCounter count = [&](const std::string& text, bool bos) -> Result<int> {
      return static_cast<int>(vocab.value()->tokenize(text, bos, true).value().size());
    };
    ChatFitInput in;
    in.messages.push_back({"system", "Be kind.", ""});
    for (int i = 0; i < 10; ++i) {
      in.messages.push_back({"user", "Question " + std::to_string(i) + " about the moon and the stars?", ""});
      in.messages.push_back({"assistant", "Answer " + std::to_string(i) + ": the moon is bright and the stars are far.", ""});
    }
    in.messages.push_back({"user", "Last question?", ""});
    in.context_tokens = 400;
    in.max_new_tokens = 30;
    for (Overflow policy : {Overflow::TruncateMiddle, Overflow::RollingWindow}) {
      in.policy = policy;
      auto fit = fit_chat(info.value(), in, count);
      QVERIFY2(fit.ok(), fit.ok() ? "" : fit.status().message.c_str());
      QCOMPARE(fit->prompt_tokens, count(fit->prompt, fit->add_bos).value());
      QVERIFY(fit->prompt_tokens + 30 <= 400);
      QCOMPARE(fit->max_new_tokens, 30);
      QVERIFY(fit->dropped_messages > 0 && fit->dropped_messages % 2 == 0);  // whole exchanges
      QVERIFY(fit->prompt.rfind("System: Be kind.", 0) == 0);
      QVERIFY(fit->prompt.find("User: Last question?\nAssistant:") != std::string::npos);
      QCOMPARE(fit->prompt.find("Question 0 ") != std::string::npos, policy == Overflow::TruncateMiddle);
      QVERIFY2(fit->prompt.find("Question 9 ") != std::string::npos, fit->prompt.c_str());  // the latest stay
      QVERIFY(fit->prompt.find("Question 1 ") == std::string::npos);  // the oldest after the first exchange went
    }
    // Stop at the limit drops nothing: too long is refused, with what to do.
    in.policy = Overflow::StopAtLimit;
    auto refused = fit_chat(info.value(), in, count);
    QVERIFY(!refused.ok());
    QVERIFY(refused.status().message.find("context holds 400") != std::string::npos);
    // ... and near the limit the answer gets only what is left.
    in.messages.resize(3);
    in.messages.push_back({"user", "Last question?", ""});
    auto whole = fit_chat(info.value(), in, count);
    QVERIFY(whole.ok());
    QCOMPARE(whole->dropped_messages, 0);
    in.context_tokens = whole->prompt_tokens + 5;
    auto tight = fit_chat(info.value(), in, count);
    QVERIFY(tight.ok());
    QCOMPARE(tight->max_new_tokens, 5);
    // Truncate-middle lets the first exchange go too when the middle is not enough.
    in.policy = Overflow::TruncateMiddle;
    in.context_tokens = count(whole->prompt, true).value() - 5;
    auto head = fit_chat(info.value(), in, count);
    QVERIFY2(head.ok(), head.ok() ? "" : head.status().message.c_str());
    QCOMPARE(head->dropped_messages, 2);
  }

  // Notebook: Ctrl+Enter in the document generates; the chat-only fields are hidden.
  void notebookKeysAndFields() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("notebook"));
    useModel(QStringLiteral("stories260k"));
    QVERIFY(!child<PromptEdit>("prompt")->isVisible());
    QVERIFY(!child<QPlainTextEdit>("systemPrompt")->isVisible());
    QVERIFY(!child<QComboBox>("overflowPolicy")->isVisible());
    child<QSpinBox>("maxTokens")->setValue(8);
    auto* doc = child<QPlainTextEdit>("notebook");
    doc->setFocus();
    QTest::keyClicks(doc, QStringLiteral("The sun"));
    QTest::keyClick(doc, Qt::Key_Return, Qt::ControlModifier);
    QVERIFY(tab_->phase() != WriteTab::Phase::Idle);
    waitIdle();
    QVERIFY(doc->toPlainText().startsWith(QStringLiteral("The sun")));
    QVERIFY(doc->toPlainText().size() > 7);
    tab_->setMode(QStringLiteral("chat"));
    QVERIFY(child<PromptEdit>("prompt")->isVisible());
    QVERIFY(child<QPlainTextEdit>("systemPrompt")->isVisible());
  }

  // "New" on an untouched conversation does not add another empty one.
  void emptyConversationsDoNotPileUp() {
    tab_->newConversation();
    auto* list = child<QListWidget>("conversations");
    const int n = list->count();
    tab_->newConversation();
    tab_->newConversation();
    QCOMPARE(list->count(), n);
  }

  // The status bar after Stop counts the prompt and the tokens written: the
  // prompt is known (counted by the tokenizer) from submission on.
  void statsAfterStopCountThePrompt() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(slowModel_);
    child<QSpinBox>("maxTokens")->setValue(200);
    QSignalSpy stats(tab_.get(), &WriteTab::statsChanged);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("A long enough question to count"));
    tab_->generate();
    QTRY_COMPARE_WITH_TIMEOUT(tab_->phase(), WriteTab::Phase::Decoding, 30000);
    tab_->stop();
    waitIdle(20000);
    const JobInfo j = lastJob();
    QCOMPARE(j.state, JobState::Cancelled);
    const QString last = stats.back().at(0).toString();
    auto vocab = Vocabulary::open(slowModel_.toStdString());
    QVERIFY(vocab.ok());
    const int prompt = static_cast<int>(vocab.value()->tokenize(j.request.prompt, j.request.add_bos, true).value().size());
    QVERIFY2(prompt > 5, qPrintable(QString::number(prompt)));
    // "N tokens" is what was written; the context counts the prompt as the engine did, plus those.
    QRegularExpression re(QStringLiteral("· (\\d+) tokens · context (\\d+)/"));
    const auto m = re.match(last);
    QVERIFY2(m.hasMatch(), qPrintable(last));
    const int written = m.captured(1).toInt();
    QVERIFY(written > 0);
    QCOMPARE(m.captured(2).toInt(), prompt + written);
  }

  // The conversations are in the data dir: a new tab (a restart) shows them.
  void conversationPersistsAcrossRestart() {
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(QStringLiteral("stories260k"));
    child<QSpinBox>("maxTokens")->setValue(20);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("Remember me"));
    tab_->generate();
    waitIdle();
    const Conversation before = tab_->conversation();
    QCOMPARE(before.turns.size(), 2);
    tab_.reset();
    store_.reset();
    openTab();
    const Conversation after = tab_->conversation();  // the newest comes first
    QCOMPARE(after.id, before.id);
    QCOMPARE(after.title, QStringLiteral("Remember me"));
    QCOMPARE(after.turns.size(), 2);
    QCOMPARE(after.turns[1].text(), before.turns[1].text());
    QVERIFY(child<QTextBrowser>("chatView")->toPlainText().contains(before.turns[1].text()));
  }

  void savesMarkdown() {
    const QString path = home_->path(QStringLiteral("chat.md"));
    QVERIFY(tab_->saveMarkdown(path));
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QString md = QString::fromUtf8(f.readAll());
    QVERIFY(md.contains(QStringLiteral("**You:** Remember me")));
    QVERIFY(md.contains(QStringLiteral("**Assistant:** ") + tab_->conversation().turns[1].text()));
  }

  // A model with a chat template: the job's prompt is exactly what the
  // template renders for the conversation (the renderer itself is checked
  // against Python's Jinja2 in tests/text), system prompt included.
  void chatUsesTheModelsTemplate() {
    const QString model = home_->path(QStringLiteral("qwen-chat.gguf"));
    QCOMPARE(uitest::runCli({QStringLiteral("models"), QStringLiteral("synth"), QStringLiteral("--params"), QStringLiteral("260K"),
                             QStringLiteral("--type"), QStringLiteral("f32"), QStringLiteral("--chat-template"),
                             uitest::fixtures() + QStringLiteral("/chat/Qwen-Qwen2.5-7B-Instruct.jinja"), QStringLiteral("-o"), model}),
             0);
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(model);
    QVERIFY2(child<QLabel>("templateNote")->text().contains(QStringLiteral("Chat template from the model")),
             qPrintable(child<QLabel>("templateNote")->text()));
    child<QPlainTextEdit>("systemPrompt")->setPlainText(QStringLiteral("You are terse."));
    child<QSpinBox>("maxTokens")->setValue(8);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("Name a colour"));
    tab_->generate();
    waitIdle();
    const JobInfo job = lastJob();
    QCOMPARE(job.state, JobState::Completed);
    // The same conversation through `atelier template render -m MODEL`.
    QFile messages(home_->path(QStringLiteral("messages.json")));
    QVERIFY(messages.open(QIODevice::WriteOnly));
    messages.write(R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour"}])");
    messages.close();
    QProcess p;
    p.start(QStringLiteral(ATELIER_BINARY), {QStringLiteral("template"), QStringLiteral("render"), QStringLiteral("-m"), model,
                                             QStringLiteral("--messages"), messages.fileName(), QStringLiteral("--add-generation-prompt")});
    QVERIFY(p.waitForFinished(30000));
    QCOMPARE(p.exitCode(), 0);
    const QByteArray expected = p.readAllStandardOutput();
    QVERIFY(expected.startsWith("<|im_start|>system\nYou are terse.<|im_end|>"));
    QCOMPARE(QByteArray::fromStdString(job.request.prompt), expected);
  }

  // The context meter counts against the model's training context, past the
  // 4096 the tab used to cap it at: the engine gives a sequence all of it.
  void contextMeterShowsTheTrainingContext() {
    QFile in(uitest::fixtures() + QStringLiteral("/text/stories260K.gguf"));
    QVERIFY(in.open(QIODevice::ReadOnly));
    QByteArray bytes = in.readAll();
    // llama.context_length is a GGUF UINT32 (type 4) after its key.
    const QByteArray key("llama.context_length");
    const qsizetype at = bytes.indexOf(key);
    QVERIFY(at > 0);
    quint32 type = 0;
    std::memcpy(&type, bytes.constData() + at + key.size(), 4);
    QCOMPARE(type, 4u);
    const quint32 ctx = 8192;
    std::memcpy(bytes.data() + at + key.size() + 4, &ctx, 4);
    const QString model = home_->path(QStringLiteral("stories-ctx8192.gguf"));
    QFile out(model);
    QVERIFY(out.open(QIODevice::WriteOnly));
    QCOMPARE(out.write(bytes), bytes.size());
    out.close();
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(model);
    child<QSpinBox>("maxTokens")->setValue(4);
    QSignalSpy stats(tab_.get(), &WriteTab::statsChanged);
    child<PromptEdit>("prompt")->setPlainText(QStringLiteral("Once upon a time"));
    tab_->generate();
    waitIdle();
    QVERIFY(!stats.isEmpty());
    const QString last = stats.back().at(0).toString();
    QVERIFY2(last.endsWith(QStringLiteral("/8192")), qPrintable(last));
    QCOMPARE(lastJob().state, JobState::Completed);
  }

  // A thinking model (Qwen3's real template; its answer forced through the
  // engine's test hook, as a random model writes no <think> block): the
  // reasoning streams folded under a "Thinking..." header with its time, the
  // answer below it; a click on the header opens it and another folds it; it
  // is kept with the conversation, and the template leaves it out of the next
  // turn's prompt.
  void thinkingStreamsFoldedAndStaysOutOfTheNextPrompt() {
    const QString model = home_->path(QStringLiteral("qwen3-think.gguf"));
    QCOMPARE(uitest::runCli({QStringLiteral("models"), QStringLiteral("synth"), QStringLiteral("--params"), QStringLiteral("260K"),
                             QStringLiteral("--type"), QStringLiteral("f32"), QStringLiteral("--chat-template"),
                             QStringLiteral(ATELIER_TESTS_DIR) + QStringLiteral("/text/templates/Qwen-Qwen3-0.6B.jinja"),
                             QStringLiteral("-o"), model}),
             0);
    const QString forced = home_->path(QStringLiteral("forced.txt"));
    auto force = [&](const QByteArray& text) {
      QFile f(forced);
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(text);
    };
    qputenv("ATELIER_TEST_FORCED_OUTPUT", forced.toUtf8());
    struct Unset {
      ~Unset() { qunsetenv("ATELIER_TEST_FORCED_OUTPUT"); }
    } unset;
    const QString reasoning = QStringLiteral("the user greets me.\nsecret plan: answer kindly.");
    force("<think>\n" + reasoning.toUtf8() + "\n</think>\n\nhello there, friend.");
    tab_->newConversation();
    tab_->setMode(QStringLiteral("chat"));
    useModel(model);
    child<QSpinBox>("maxTokens")->setValue(200);  // the synthetic vocabulary spells the answer nearly byte by byte
    auto* view = child<QTextBrowser>("chatView");
    int tokens = 0, shownWhileStreaming = 0, headerWhileStreaming = 0, answerBelowHeader = 0;
    const QString shots = qEnvironmentVariable("ATELIER_TEST_SHOTS");
    bool shot = false;
    QObject scope;
    connect(bridge_.get(), &bridge::EngineBridge::event, &scope, [&](const Event& ev) {
      if (ev.type != EventType::Token) return;
      ++tokens;
      const QString seen = view->toPlainText();
      if (seen.contains(QStringLiteral("secret plan"))) ++shownWhileStreaming;
      if (seen.contains(QStringLiteral("Thinking\u2026"))) ++headerWhileStreaming;
      const qsizetype header = seen.indexOf(QStringLiteral("Thought for"));
      if (header >= 0 && seen.indexOf(QStringLiteral("hello"), header) > header) ++answerBelowHeader;
      if (!shots.isEmpty() && !shot && seen.contains(QStringLiteral("hello there"))) {
        shot = tab_->grab().save(shots + QStringLiteral("/write-thinking-streaming.png"));
      }
    });
    auto* prompt = child<PromptEdit>("prompt");
    prompt->setFocus();
    QTest::keyClicks(prompt, QStringLiteral("hi"));
    QTest::keyClick(prompt, Qt::Key_Return, Qt::ControlModifier);
    waitIdle();
    QVERIFY2(tokens > 20, qPrintable(QString::number(tokens)));
    QCOMPARE(shownWhileStreaming, 0);  // folded: the reasoning's text never showed
    QVERIFY2(headerWhileStreaming > 5, qPrintable(QString::number(headerWhileStreaming)));
    QVERIFY(answerBelowHeader > 0);
    const ChatTurn answer = tab_->conversation().turns.at(1);
    QCOMPARE(answer.text(), QStringLiteral("hello there, friend."));
    QCOMPARE(answer.reasoningText(), reasoning);
    QString seen = view->toPlainText();
    QVERIFY2(!seen.contains(QStringLiteral("secret plan")) && !seen.contains(QStringLiteral("<think>")), qPrintable(seen));
    QVERIFY(seen.contains(QStringLiteral("hello there, friend.")));

    // A click on the header opens the block; another folds it.
    auto clickText = [&](const QString& text) {
      const QTextCursor found = view->document()->find(text);
      QVERIFY2(!found.isNull(), qPrintable(text));
      QTextCursor at(view->document());
      at.setPosition(found.selectionStart() + 2);
      QTest::mouseClick(view->viewport(), Qt::LeftButton, {}, view->cursorRect(at).center());
    };
    clickText(QStringLiteral("Thought"));
    QTRY_VERIFY(view->toPlainText().contains(QStringLiteral("secret plan: answer kindly.")));
    if (!shots.isEmpty()) QVERIFY(tab_->grab().save(shots + QStringLiteral("/write-thinking-open.png")));
    clickText(QStringLiteral("Thought"));
    QTRY_VERIFY(!view->toPlainText().contains(QStringLiteral("secret plan")));

    // Kept with the conversation (a new store reads it back).
    store_->flush();
    {
      ConversationStore again(home_->home());
      bool found = false;
      for (const Conversation& c : again.loadAll())
        if (c.id == tab_->conversation().id) {
          found = true;
          QCOMPARE(c.turns.at(1).reasoningText(), reasoning);
          QCOMPARE(c.turns.at(1).text(), QStringLiteral("hello there, friend."));
        }
      QVERIFY(found);
    }

    // The next turn: the earlier answer is in the prompt, its thinking is not.
    force("fine.");
    QTest::keyClicks(prompt, QStringLiteral("and you?"));
    QTest::keyClick(prompt, Qt::Key_Return, Qt::ControlModifier);
    waitIdle();
    const JobInfo job = lastJob();
    QCOMPARE(job.state, JobState::Completed);
    const QString sent = QString::fromStdString(job.request.prompt);
    QVERIFY2(sent.contains(QStringLiteral("<|im_start|>assistant\nhello there, friend.<|im_end|>")), qPrintable(sent));
    QVERIFY2(!sent.contains(QStringLiteral("secret plan")), qPrintable(sent));
    QCOMPARE(tab_->conversation().turns.at(3).text(), QStringLiteral("fine."));
    QVERIFY(tab_->conversation().turns.at(3).reasoningText().isEmpty());
  }

  void cleanupTestCase() {
    tab_.reset();
    store_.reset();
    bridge_.reset();
  }
};

QTEST_MAIN(WriteTest)
#include "write_test.moc"
