#include "paint/infotext.h"

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QRegularExpression>

#include <algorithm>

namespace atelier::ui {

namespace {

// A1111's re_param (modules/infotext_utils.py): a key of word characters,
// spaces, dashes and slashes; a quoted value with \" escapes, or anything up
// to the next comma.
const QRegularExpression& paramPattern() {
  static const QRegularExpression re(QStringLiteral(R"re(\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$))re"));
  return re;
}

// A quoted value is a JSON string (A1111 writes it with json.dumps).
QString unquote(const QString& v) {
  if (v.size() < 2 || !v.startsWith('"') || !v.endsWith('"')) return v;
  const QJsonDocument doc = QJsonDocument::fromJson(('[' + v + ']').toUtf8());
  if (doc.isArray() && doc.array().size() == 1 && doc.array().at(0).isString()) return doc.array().at(0).toString();
  return v;
}

QList<QPair<QString, QString>> params(const QString& line) {
  QList<QPair<QString, QString>> out;
  auto it = paramPattern().globalMatch(line);
  while (it.hasNext()) {
    const auto m = it.next();
    if (m.capturedLength(0) == 0) break;
    out.append({m.captured(1).trimmed(), unquote(m.captured(2).trimmed())});
  }
  return out;
}

}  // namespace

QString Infotext::value(const QString& key) const {
  for (const auto& [k, v] : extra)
    if (k.compare(key, Qt::CaseInsensitive) == 0) return v;
  return {};
}

Infotext parseInfotext(const QString& text) {
  Infotext info;
  QStringList lines = text.trimmed().split('\n');
  QString last = lines.isEmpty() ? QString() : lines.takeLast();
  QList<QPair<QString, QString>> kv = params(last);
  if (kv.size() < 3) {
    lines.append(last);
    kv.clear();
  }
  bool negative = false;
  for (QString line : std::as_const(lines)) {
    line = line.trimmed();
    if (line.startsWith(QLatin1String("Negative prompt:"))) {
      negative = true;
      line = line.mid(16).trimmed();
    }
    QString& target = negative ? info.negativePrompt : info.prompt;
    if (!target.isEmpty()) target += '\n';
    target += line;
  }
  info.hasParameters = !kv.isEmpty();
  static const QRegularExpression size(QStringLiteral(R"(^\s*(\d+)\s*x\s*(\d+)\s*$)"));
  for (const auto& [key, value] : kv) {
    bool ok = false;
    if (key == QLatin1String("Steps")) {
      const int v = value.toInt(&ok);
      if (ok) {
        info.steps = v;
        continue;
      }
    } else if (key == QLatin1String("Sampler")) {
      info.sampler = value;
      continue;
    } else if (key == QLatin1String("Schedule type")) {
      info.scheduleType = value;
      continue;
    } else if (key == QLatin1String("CFG scale")) {
      const double v = value.toDouble(&ok);
      if (ok) {
        info.cfgScale = v;
        continue;
      }
    } else if (key == QLatin1String("Seed")) {
      const quint64 v = value.toULongLong(&ok);
      if (ok) {
        info.seed = v;
        continue;
      }
    } else if (key == QLatin1String("Size")) {
      if (const auto m = size.match(value); m.hasMatch()) {
        info.width = m.captured(1).toInt();
        info.height = m.captured(2).toInt();
        continue;
      }
    } else if (key == QLatin1String("Model")) {
      info.model = value;
      continue;
    } else if (key == QLatin1String("Model hash")) {
      info.modelHash = value;
      continue;
    } else if (key == QLatin1String("Denoising strength")) {
      const double v = value.toDouble(&ok);
      if (ok) {
        info.denoisingStrength = v;
        continue;
      }
    } else if (key == QLatin1String("RNG")) {
      info.rng = value;
      continue;
    }
    info.extra.append({key, value});  // unknown, or a known key whose value did not parse
  }
  return info;
}

QStringList engineSamplers() {
  return {QStringLiteral("euler_a"), QStringLiteral("euler"), QStringLiteral("heun"), QStringLiteral("dpmpp_2m"),
          QStringLiteral("ddim"), QStringLiteral("lcm")};
}

std::optional<SamplerChoice> mapSampler(const QString& name) {
  QString n = name.trimmed();
  QString scheduler;
  // A1111 before 1.9 named the Karras schedule in the sampler: "DPM++ 2M Karras".
  if (n.endsWith(QLatin1String(" Karras"), Qt::CaseInsensitive)) {
    n.chop(7);
    scheduler = QStringLiteral("karras");
  }
  const QString key = n.toLower();
  static const QList<QPair<QString, QString>> names = {
      {QStringLiteral("euler a"), QStringLiteral("euler_a")},   {QStringLiteral("euler_a"), QStringLiteral("euler_a")},
      {QStringLiteral("euler_ancestral"), QStringLiteral("euler_a")},  // ComfyUI
      {QStringLiteral("euler"), QStringLiteral("euler")},       {QStringLiteral("heun"), QStringLiteral("heun")},
      {QStringLiteral("dpm++ 2m"), QStringLiteral("dpmpp_2m")}, {QStringLiteral("dpmpp_2m"), QStringLiteral("dpmpp_2m")},
      {QStringLiteral("ddim"), QStringLiteral("ddim")},         {QStringLiteral("lcm"), QStringLiteral("lcm")},
  };
  for (const auto& [a1111, ours] : names)
    if (key == a1111) return SamplerChoice{ours, scheduler};
  return std::nullopt;
}

std::optional<QString> mapScheduleType(const QString& name) {
  const QString n = name.trimmed().toLower();
  if (n == QLatin1String("karras")) return QStringLiteral("karras");
  // A1111's default ("Automatic": the sampler's own, discrete for these) and
  // "Uniform" (evenly spaced timesteps) are the engine's discrete schedule.
  if (n.isEmpty() || n == QLatin1String("automatic") || n == QLatin1String("uniform") || n == QLatin1String("discrete"))
    return QStringLiteral("discrete");
  return std::nullopt;
}

namespace {

// zlib data (zTXt, compressed iTXt) through qUncompress, which wants the
// expected size in front (it grows its buffer when the guess is short).
QByteArray inflate(const QByteArray& z) {
  QByteArray framed(4, '\0');
  const quint32 guess = static_cast<quint32>(std::min<qsizetype>(z.size() * 8 + 64, 1 << 24));
  for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>((guess >> (24 - 8 * i)) & 0xff);
  return qUncompress(framed + z);
}

// tEXt is Latin-1 by the standard; some writers put UTF-8 there anyway.
QString decodeLatinOrUtf8(const QByteArray& b) {
  const QString utf8 = QString::fromUtf8(b);
  return utf8.contains(QChar::ReplacementCharacter) ? QString::fromLatin1(b) : utf8;
}

}  // namespace

QString readPngText(const QString& path, const QString& key, QString* error) {
  auto fail = [&](const QString& why) {
    if (error) *error = why;
    return QString();
  };
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return fail(f.errorString());
  if (f.read(8) != QByteArray("\x89PNG\r\n\x1a\n", 8)) return fail(QStringLiteral("not a PNG file"));
  constexpr quint32 kMaxText = 16u << 20;  // a text chunk beyond 16 MiB is not infotext
  const QByteArray wanted = key.toLatin1();
  while (true) {
    const QByteArray head = f.read(8);
    if (head.size() < 8) return {};
    const quint32 len = (quint32(uchar(head[0])) << 24) | (quint32(uchar(head[1])) << 16) | (quint32(uchar(head[2])) << 8) |
                        quint32(uchar(head[3]));
    const QByteArray type = head.mid(4, 4);
    if (type == "IEND") return {};
    const qint64 next = f.pos() + static_cast<qint64>(len) + 4;  // data + CRC
    if (next > f.size()) return fail(QStringLiteral("truncated PNG chunk"));
    if ((type == "tEXt" || type == "zTXt" || type == "iTXt") && len <= kMaxText) {
      const QByteArray data = f.read(len);
      const qsizetype nul = data.indexOf('\0');
      if (nul > 0 && data.left(nul) == wanted) {
        const QByteArray rest = data.mid(nul + 1);
        if (type == "tEXt") return decodeLatinOrUtf8(rest);
        if (type == "zTXt") return rest.isEmpty() ? QString() : QString::fromLatin1(inflate(rest.mid(1)));
        // iTXt: compression flag, method, language\0, translated keyword\0, text (UTF-8)
        if (rest.size() < 2) return {};
        const bool compressed = rest[0] != 0;
        const qsizetype lang = rest.indexOf('\0', 2);
        const qsizetype translated = lang < 0 ? -1 : rest.indexOf('\0', lang + 1);
        if (translated < 0) return {};
        const QByteArray text = rest.mid(translated + 1);
        return QString::fromUtf8(compressed ? inflate(text) : text);
      }
    }
    if (!f.seek(next)) return {};
  }
}

}  // namespace atelier::ui
