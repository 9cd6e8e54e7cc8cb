// Conversations of the Write tab, kept in the data dir (SQLite,
// studio.db): a chat's messages with every regenerated variant, or a
// notebook's document. Saves run on one background thread, in order, so
// the UI thread never waits for the disk; loading happens once at start.
#pragma once

#include <QMutex>
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QVector>

struct sqlite3;

namespace atelier::ui {

struct ChatTurn {
  QString role;          // "user", "assistant"
  QStringList variants;  // regenerations keep every answer; edits replace the current one
  int current = 0;
  QStringList reasoning; // an assistant variant's thinking (<think>, gpt-oss's analysis), beside variants ("" or missing: none)
  QString text() const { return variants.value(current); }
  QString reasoningText() const { return reasoning.value(current); }
};

struct Conversation {
  qint64 id = 0;         // 0 until first saved
  QString title;
  QString mode = QStringLiteral("chat");  // "chat" or "notebook"
  QString model;
  QString system;        // chat: the system prompt
  QString document;      // notebook: the whole text
  int contextTokens = 0; // chat: the context size its prompts are fitted to (0: the model's training context)
  QString overflow = QStringLiteral("truncate-middle");  // chat: what goes when it does not fit (context_fit.h)
  QVector<ChatTurn> turns;
  qint64 updatedMs = 0;
};

class ConversationStore {
 public:
  // Opens (creating) DIR/studio.db. On failure ok() is false and error() says why.
  explicit ConversationStore(const QString& dataDir);
  ~ConversationStore();  // waits for pending saves
  bool ok() const { return db_ != nullptr; }
  QString error() const { return error_; }

  QVector<Conversation> loadAll();                 // newest first
  qint64 allocateId();                             // an id for a new conversation (synchronous, tiny)
  void save(const Conversation& conversation);     // asynchronous; conversation.id must be set
  void remove(qint64 id);                          // asynchronous
  void flush();                                    // waits for pending saves (tests, exit)

 private:
  void exec(const char* sql);
  ::sqlite3* db_ = nullptr;
  // The connection serves the UI thread (load, allocate) and the writer thread
  // (saves); this keeps a save's transaction whole against a load.
  QMutex mutex_;
  QString error_;
  QThreadPool writer_;
};

}  // namespace atelier::ui
