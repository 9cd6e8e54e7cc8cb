#include "common/seed_box.h"

#include <QHBoxLayout>
#include <QLineEdit>
#include <QRandomGenerator>
#include <QRegularExpressionValidator>
#include <QToolButton>

namespace atelier::ui {

SeedBox::SeedBox(QWidget* parent) : QWidget(parent) {
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  edit_ = new QLineEdit(this);
  // Up to 19 digits: every value below 2^63 (the engine's random seeds are 63-bit).
  edit_->setValidator(new QRegularExpressionValidator(QRegularExpression(QStringLiteral("[0-9]{1,19}")), edit_));
  edit_->setToolTip(tr("Seed: the same seed, model and parameters give the same output"));
  edit_->setObjectName(QStringLiteral("seed"));
  dice_ = new QToolButton(this);
  dice_->setText(QStringLiteral("\u2684"));  // die face
  dice_->setToolTip(tr("Roll a new random seed"));
  dice_->setObjectName(QStringLiteral("seedDice"));
  dice_->setAccessibleName(tr("Roll a new random seed"));
  lock_ = new QToolButton(this);
  lock_->setCheckable(true);
  lock_->setText(tr("Lock"));
  lock_->setToolTip(tr("Locked: every job uses this seed. Unlocked: each job gets a new random seed"));
  lock_->setObjectName(QStringLiteral("seedLock"));
  layout->addWidget(edit_, 1);
  layout->addWidget(dice_);
  layout->addWidget(lock_);
  connect(dice_, &QToolButton::clicked, this, &SeedBox::roll);
  roll();
}

uint64_t SeedBox::seed() const { return edit_->text().toULongLong(); }

void SeedBox::setSeed(uint64_t seed) {
  edit_->setText(QString::number(seed & 0x7fffffffffffffffull));
  setLocked(true);
}

bool SeedBox::locked() const { return lock_->isChecked(); }
void SeedBox::setLocked(bool locked) { lock_->setChecked(locked); }

// 32-bit, as A1111 rolls them: short enough to read and type back.
void SeedBox::roll() { edit_->setText(QString::number(QRandomGenerator::global()->generate())); }

uint64_t SeedBox::takeSeed() {
  if (!locked() || edit_->text().isEmpty()) roll();
  return seed();
}

}  // namespace atelier::ui
