// The studio's main window. For now: the models Atelier can see, with what
// their headers say. The studio (prompt, gallery, queue) grows from here.
#pragma once

#include <QMainWindow>
#include <QStringList>

class QTableWidget;
class QLabel;

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(QStringList modelFolders, QWidget* parent = nullptr);

 public slots:
  void refreshModels();

 private:
  QStringList modelFolders_;
  QTableWidget* table_;
  QLabel* status_;
};
