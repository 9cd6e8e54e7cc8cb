#include "write/conversation_store.h"

#include <sqlite3.h>

#include <QDateTime>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QMutexLocker>

namespace atelier::ui {

namespace {
QString columnText(sqlite3_stmt* st, int i) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
  return p ? QString::fromUtf8(p, sqlite3_column_bytes(st, i)) : QString();
}

void bindText(sqlite3_stmt* st, int i, const QString& s) {
  const QByteArray b = s.toUtf8();
  sqlite3_bind_text(st, i, b.constData(), static_cast<int>(b.size()), SQLITE_TRANSIENT);
}
}  // namespace

ConversationStore::ConversationStore(const QString& dataDir) {
  writer_.setMaxThreadCount(1);  // saves land in the order they were made
  QDir().mkpath(dataDir);
  const QByteArray path = QDir(dataDir).filePath(QStringLiteral("studio.db")).toUtf8();
  if (sqlite3_open_v2(path.constData(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    error_ = QStringLiteral("%1: cannot open the conversation database: %2")
                 .arg(QString::fromUtf8(path), QString::fromUtf8(db_ ? sqlite3_errmsg(db_) : "out of memory"));
    sqlite3_close(db_);
    db_ = nullptr;
    return;
  }
  sqlite3_busy_timeout(db_, 5000);
  exec("PRAGMA journal_mode=WAL");
  exec("PRAGMA synchronous=NORMAL");
  exec("CREATE TABLE IF NOT EXISTS conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, mode TEXT NOT NULL,"
       " model TEXT NOT NULL, system TEXT NOT NULL, document TEXT NOT NULL, updated_ms INTEGER NOT NULL)");
  exec("CREATE TABLE IF NOT EXISTS turns (conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
       " idx INTEGER NOT NULL, role TEXT NOT NULL, variants TEXT NOT NULL, current INTEGER NOT NULL,"
       " PRIMARY KEY (conversation, idx))");
  // Added later: a database from before has these columns added once (the error for an existing column is expected).
  for (const char* sql : {"ALTER TABLE conversations ADD COLUMN context_tokens INTEGER NOT NULL DEFAULT 0",
                          "ALTER TABLE conversations ADD COLUMN overflow TEXT NOT NULL DEFAULT 'truncate-middle'",
                          "ALTER TABLE turns ADD COLUMN reasoning TEXT NOT NULL DEFAULT '[]'"})
    sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
}

ConversationStore::~ConversationStore() {
  writer_.waitForDone();
  if (db_) sqlite3_close(db_);
}

void ConversationStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    error_ = QString::fromUtf8(err ? err : "unknown error");
    sqlite3_free(err);
  }
}

QVector<Conversation> ConversationStore::loadAll() {
  QVector<Conversation> out;
  if (!db_) return out;
  QMutexLocker lock(&mutex_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT id, title, mode, model, system, document, updated_ms, context_tokens, overflow FROM conversations ORDER BY updated_ms DESC, id DESC",
                     -1, &st, nullptr);
  while (st && sqlite3_step(st) == SQLITE_ROW) {
    Conversation c;
    c.id = sqlite3_column_int64(st, 0);
    c.title = columnText(st, 1);
    c.mode = columnText(st, 2);
    c.model = columnText(st, 3);
    c.system = columnText(st, 4);
    c.document = columnText(st, 5);
    c.updatedMs = sqlite3_column_int64(st, 6);
    c.contextTokens = sqlite3_column_int(st, 7);
    c.overflow = columnText(st, 8);
    out.push_back(c);
  }
  sqlite3_finalize(st);
  sqlite3_prepare_v2(db_, "SELECT role, variants, current, reasoning FROM turns WHERE conversation = ? ORDER BY idx", -1, &st, nullptr);
  for (Conversation& c : out) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, c.id);
    while (sqlite3_step(st) == SQLITE_ROW) {
      ChatTurn t;
      t.role = columnText(st, 0);
      for (const auto& v : QJsonDocument::fromJson(columnText(st, 1).toUtf8()).array()) t.variants << v.toString();
      if (t.variants.isEmpty()) t.variants << QString();
      t.current = std::clamp(sqlite3_column_int(st, 2), 0, static_cast<int>(t.variants.size()) - 1);
      for (const auto& v : QJsonDocument::fromJson(columnText(st, 3).toUtf8()).array()) t.reasoning << v.toString();
      c.turns.push_back(t);
    }
  }
  sqlite3_finalize(st);
  return out;
}

qint64 ConversationStore::allocateId() {
  if (!db_) return QDateTime::currentMSecsSinceEpoch();
  QMutexLocker lock(&mutex_);
  sqlite3_stmt* st = nullptr;
  qint64 id = 1;
  // Placeholder row, filled by the first save; keeps ids unique across restarts.
  sqlite3_prepare_v2(db_, "INSERT INTO conversations (title, mode, model, system, document, updated_ms) VALUES ('', 'chat', '', '', '', ?)", -1,
                     &st, nullptr);
  sqlite3_bind_int64(st, 1, QDateTime::currentMSecsSinceEpoch());
  if (sqlite3_step(st) == SQLITE_DONE) id = sqlite3_last_insert_rowid(db_);
  sqlite3_finalize(st);
  return id;
}

void ConversationStore::save(const Conversation& conversation) {
  if (!db_ || conversation.id == 0) return;
  Conversation c = conversation;
  c.updatedMs = c.updatedMs ? c.updatedMs : QDateTime::currentMSecsSinceEpoch();
  writer_.start([this, c] {
    QMutexLocker lock(&mutex_);
    sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db_,
                       "INSERT OR REPLACE INTO conversations (id, title, mode, model, system, document, updated_ms, context_tokens, overflow)"
                       " VALUES (?,?,?,?,?,?,?,?,?)",
                       -1, &st, nullptr);
    sqlite3_bind_int64(st, 1, c.id);
    bindText(st, 2, c.title);
    bindText(st, 3, c.mode);
    bindText(st, 4, c.model);
    bindText(st, 5, c.system);
    bindText(st, 6, c.document);
    sqlite3_bind_int64(st, 7, c.updatedMs);
    sqlite3_bind_int(st, 8, c.contextTokens);
    bindText(st, 9, c.overflow);
    bool ok = sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    sqlite3_prepare_v2(db_, "DELETE FROM turns WHERE conversation = ?", -1, &st, nullptr);
    sqlite3_bind_int64(st, 1, c.id);
    ok = ok && sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    sqlite3_prepare_v2(db_, "INSERT INTO turns (conversation, idx, role, variants, current, reasoning) VALUES (?,?,?,?,?,?)", -1, &st, nullptr);
    for (int i = 0; ok && i < c.turns.size(); ++i) {
      sqlite3_reset(st);
      sqlite3_bind_int64(st, 1, c.id);
      sqlite3_bind_int(st, 2, i);
      bindText(st, 3, c.turns[i].role);
      bindText(st, 4, QString::fromUtf8(QJsonDocument(QJsonArray::fromStringList(c.turns[i].variants)).toJson(QJsonDocument::Compact)));
      sqlite3_bind_int(st, 5, c.turns[i].current);
      bindText(st, 6, QString::fromUtf8(QJsonDocument(QJsonArray::fromStringList(c.turns[i].reasoning)).toJson(QJsonDocument::Compact)));
      ok = sqlite3_step(st) == SQLITE_DONE;
    }
    sqlite3_finalize(st);
    // A failed save (disk full) keeps the previous copy whole.
    sqlite3_exec(db_, ok ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
  });
}

void ConversationStore::remove(qint64 id) {
  if (!db_) return;
  writer_.start([this, id] {
    QMutexLocker lock(&mutex_);
    sqlite3_stmt* st = nullptr;
    for (const char* sql : {"DELETE FROM turns WHERE conversation = ?", "DELETE FROM conversations WHERE id = ?"}) {
      sqlite3_prepare_v2(db_, sql, -1, &st, nullptr);
      sqlite3_bind_int64(st, 1, id);
      sqlite3_step(st);
      sqlite3_finalize(st);
    }
  });
}

void ConversationStore::flush() { writer_.waitForDone(); }

}  // namespace atelier::ui
