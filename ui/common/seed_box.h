// A seed field with a dice button (a new random seed) and a lock (keep this
// seed for the next jobs; unlocked, every job gets a fresh one).
#pragma once

#include <QWidget>

#include <cstdint>

class QLineEdit;
class QToolButton;

namespace atelier::ui {

class SeedBox : public QWidget {
  Q_OBJECT

 public:
  explicit SeedBox(QWidget* parent = nullptr);
  uint64_t seed() const;         // the value shown
  void setSeed(uint64_t seed);   // also locks it, so the next job reproduces it
  bool locked() const;
  void setLocked(bool locked);
  // The seed for the next job: the shown one when locked, else a fresh random one (then shown).
  uint64_t takeSeed();
  void roll();                   // the dice

 private:
  QLineEdit* edit_;
  QToolButton* dice_;
  QToolButton* lock_;
};

}  // namespace atelier::ui
