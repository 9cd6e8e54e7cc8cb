#include "common/fold_section.h"

#include <QToolButton>
#include <QVBoxLayout>

namespace atelier::ui {

FoldSection::FoldSection(const QString& title, QWidget* parent) : QWidget(parent) {
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(0, 0, 0, 0);
  v->setSpacing(2);
  header_ = new QToolButton(this);
  header_->setText(title);
  header_->setCheckable(true);
  header_->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
  header_->setArrowType(Qt::RightArrow);
  header_->setAutoRaise(true);
  header_->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  QFont bold = header_->font();
  bold.setBold(true);
  header_->setFont(bold);
  body_ = new QWidget(this);
  body_->hide();
  v->addWidget(header_);
  v->addWidget(body_);
  connect(header_, &QToolButton::toggled, this, [this](bool open) {
    header_->setArrowType(open ? Qt::DownArrow : Qt::RightArrow);
    body_->setVisible(open);
    emit toggled(open);
  });
}

bool FoldSection::isOpen() const { return header_->isChecked(); }

void FoldSection::setOpen(bool open) { header_->setChecked(open); }

}  // namespace atelier::ui
