// History: every finished job (text and image) from the job database,
// searchable by prompt text and model, by kind and by date, with its
// parameters, the model digest and the seed. Reopen puts a job back in Write
// or Paint with the same parameters; Run again submits the same request with
// the same seed (so the same model version gives the same output).
#pragma once

#include <QWidget>

#include "bridge/engine_bridge.h"

class QComboBox;
class QLineEdit;
class QPushButton;
class QTableWidget;
class QTextBrowser;

namespace atelier::ui {

class HistoryView : public QWidget {
  Q_OBJECT

 public:
  explicit HistoryView(bridge::EngineBridge* bridge, QWidget* parent = nullptr);

  QTableWidget* table() const { return table_; }
  QLineEdit* search() const { return search_; }
  QComboBox* kindBox() const { return kind_; }
  QComboBox* dateBox() const { return date_; }
  QVector<atelier::JobId> shownJobs() const;  // the rows, top to bottom
  bool selectJob(atelier::JobId id);
  atelier::JobId selectedJob() const;
  QString detailText() const;

 public slots:
  void reload();       // from the bridge's job list
  void reopenSelected();
  void runAgainSelected();

 signals:
  void reopenText(const atelier::JobInfo& job);
  void reopenImage(const atelier::JobInfo& job);
  void ranAgain(qint64 original, qint64 copy);  // the new job was queued
  void statusMessage(const QString& text);

 private:
  bool matches(const atelier::JobInfo& job) const;
  void showDetail();

  bridge::EngineBridge* bridge_;
  QLineEdit* search_;
  QComboBox* kind_;
  QComboBox* date_;
  QTableWidget* table_;
  QTextBrowser* detail_;
  QPushButton* reopen_;
  QPushButton* runAgain_;
  QHash<atelier::JobId, atelier::JobInfo> finished_;
};

}  // namespace atelier::ui
