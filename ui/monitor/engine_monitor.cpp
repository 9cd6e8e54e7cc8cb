#include "monitor/engine_monitor.h"

#include <imgui.h>
#include <backends/imgui_impl_opengl3.h>

#include <QGuiApplication>
#include <QMouseEvent>
#include <QOpenGLContext>
#include <QOpenGLFunctions>
#include <QWheelEvent>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace atelier::ui {

namespace {
// The process's resident memory (Linux /proc), 0 where it cannot be read.
double residentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long pages = 0, resident = 0;
  const bool ok = std::fscanf(f, "%ld %ld", &pages, &resident) == 2;
  std::fclose(f);
  return ok ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : 0;
}

constexpr size_t kFrameWindow = 240;  // frames the statistics cover

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

// A scrolling plot of SERIES (oldest first), scaled to its largest value and
// to THRESHOLD (drawn as a red line when > 0) so the line is always in view.
void plot(const char* label, const std::vector<float>& series, const char* unit, float threshold = -1, float fixedMax = 0) {
  const float last = series.empty() ? 0.f : series.back();
  float hi = fixedMax;
  if (hi <= 0) {
    for (float v : series) hi = std::max(hi, v);
    hi = std::max({hi * 1.15f, threshold * 1.15f, 1e-3f});
  }
  const QByteArray overlay = EngineMonitor::figure(static_cast<double>(last), unit);
  const float w = ImGui::GetContentRegionAvail().x;
  ImGui::PlotLines(label, series.empty() ? &last : series.data(), series.empty() ? 1 : static_cast<int>(series.size()), 0,
                   overlay.constData(), 0.f, hi, ImVec2(std::max(40.f, w - 150.f), 40.f));
  if (threshold > 0) {
    const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
    // The plot frame's label sits right of the frame: the frame is the item's width minus it.
    const float frameRight = a.x + std::max(40.f, w - 150.f);
    const float y = b.y - (b.y - a.y) * std::clamp(threshold / hi, 0.f, 1.f);
    ImGui::GetWindowDrawList()->AddLine(ImVec2(a.x, y), ImVec2(frameRight, y), IM_COL32(230, 70, 70, 220), 1.5f);
  }
}
}  // namespace

QByteArray EngineMonitor::figure(double v, const char* unit) {
  QByteArray u(unit);
  if (u == "bytes") {
    static const char* names[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (std::abs(v) >= 1024 && i < 4) v /= 1024, ++i;
    u = names[i];
  }
  // Three significant digits at most, never an exponent: 26200, 512, 12.3, 0.50.
  const int decimals = std::abs(v) >= 100 || v == 0 ? 0 : std::abs(v) >= 10 ? 1 : 2;
  QByteArray out = QByteArray::number(v, 'f', decimals);
  if (!u.isEmpty()) out += ' ' + u;
  return out;
}

bool EngineMonitor::openGLAvailable() {
  static const bool available = [] {
    if (QGuiApplication::platformName() == QLatin1String("offscreen") || QGuiApplication::platformName() == QLatin1String("minimal"))
      return false;
    QOpenGLContext probe;
    return probe.create();
  }();
  return available;
}

EngineMonitor::EngineMonitor(bridge::EngineBridge* bridge, QWidget* parent) : QOpenGLWidget(parent), bridge_(bridge) {
  setObjectName(QStringLiteral("engineMonitor"));
  setAccessibleName(tr("Engine monitor"));
  setMinimumSize(360, 300);
  setMouseTracking(true);
  clock_.start();
  poll_.setInterval(250);
  connect(&poll_, &QTimer::timeout, this, [this] {
    // Behind another dock tab, or in a minimised window, nobody sees the figures.
    if (isVisible() && !visibleRegion().isEmpty()) pollNow();
  });
}

EngineMonitor::~EngineMonitor() {
  if (imgui_) {
    makeCurrent();
    ImGui::SetCurrentContext(imgui_);
    if (rendererReady_) ImGui_ImplOpenGL3_Shutdown();
    ImGui::DestroyContext(imgui_);
    doneCurrent();
  }
}

void EngineMonitor::showEvent(QShowEvent* event) {
  QOpenGLWidget::showEvent(event);
  poll_.start();
  pollNow();
  update();
}

void EngineMonitor::hideEvent(QHideEvent* event) {
  QOpenGLWidget::hideEvent(event);
  poll_.stop();
}

void EngineMonitor::pollNow() {
  if (!bridge_ || !bridge_->isOpen() || pollInFlight_) return;
  pollInFlight_ = true;
  bridge_->run<EngineMetrics>([](Engine* e) { return e ? e->metrics() : EngineMetrics{}; },
                              [this](EngineMetrics m) {
                                pollInFlight_ = false;
                                int text = 0, image = 0, running = 0;
                                for (const JobInfo& j : bridge_->jobs()) {
                                  if (j.state == JobState::Queued) ++(j.kind == "image" ? image : text);
                                  if (j.state == JobState::Running) ++running;  // image jobs too
                                }
                                const bool first = data_.samples().empty();
                                data_.add(m, static_cast<double>(clock_.elapsed()) / 1000.0, text, image, running, residentBytes());
                                ++polls_;
                                const auto& s = data_.samples();
                                const bool changed = first || s.size() < 2 || !s[s.size() - 1].same_figures(s[s.size() - 2]) || !m.active_alerts.empty();
                                // The device's memory alone: redrawn now and then, not at every drift of the machine's free memory.
                                const bool deviceDue = !changed && s.size() >= 2 && s.back().device_used_bytes != drawnDeviceBytes_ &&
                                                       (!lastFrame_.isValid() || lastFrame_.elapsed() >= kDeviceRedrawMs);
                                if (changed || deviceDue) update();
                                emit sampled();
                              });
}

void EngineMonitor::initializeGL() {
  IMGUI_CHECKVERSION();
  ImGuiContext* previous = ImGui::GetCurrentContext();
  imgui_ = ImGui::CreateContext();
  ImGui::SetCurrentContext(imgui_);
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the dock's layout is Qt's
  ImGui::StyleColorsDark();
  ImGui::GetStyle().WindowRounding = 0;
  // GLSL 1.30 runs on every GL 3.0+ context, Mesa's llvmpipe included.
  rendererReady_ = ImGui_ImplOpenGL3_Init("#version 130");
  if (!rendererReady_) qWarning("engine monitor: the OpenGL renderer did not start; the panel stays blank");
  ImGui::SetCurrentContext(previous ? previous : imgui_);
}

void EngineMonitor::resizeGL(int, int) {}

void EngineMonitor::buildFrame() {
  drawnDeviceBytes_ = data_.samples().empty() ? 0 : data_.samples().back().device_used_bytes;
  ImGui::NewFrame();
  ImGui::SetNextWindowPos(ImVec2(0, 0));
  ImGui::SetNextWindowSize(ImGui::GetIO().DisplaySize);
  ImGui::Begin("Engine", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings);
  const auto& rules = data_.rules();
  const MonitorSample last = data_.samples().empty() ? MonitorSample{} : data_.samples().back();
  ImGui::Text("%zu samples, %d running, %d text + %d image queued", data_.samples().size(), last.running, last.queued_text,
              last.queued_image);
  if (ImGui::CollapsingHeader("Throughput", ImGuiTreeNodeFlags_DefaultOpen)) {
    // The throughput alert fires below (1 - drop) x the recent average: that line is drawn.
    plot("tokens/s", data_.series(&MonitorSample::tokens_per_s), "tok/s",
         static_cast<float>((1.0 - rules.throughput_drop_fraction) * last.recent_tokens_per_s));
    plot("image steps/s", data_.series(&MonitorSample::image_steps_per_s), "steps/s");
    plot("batch size", data_.series(&MonitorSample::batch_mean), "seqs");
    plot("busy", data_.series(&MonitorSample::busy_fraction), "", -1, 1.0f);
  }
  if (ImGui::CollapsingHeader("Queue", ImGuiTreeNodeFlags_DefaultOpen)) {
    plot("queued text", data_.series(&MonitorSample::queued_text), "jobs");
    plot("queued image", data_.series(&MonitorSample::queued_image), "jobs");
  }
  if (ImGui::CollapsingHeader("Latency", ImGuiTreeNodeFlags_DefaultOpen)) {
    plot("TTFT P50", data_.series(&MonitorSample::ttft_p50_ms), "ms");
    plot("TTFT P99", data_.series(&MonitorSample::ttft_p99_ms), "ms");
    plot("ITL P50", data_.series(&MonitorSample::itl_p50_ms), "ms");
    plot("ITL P99", data_.series(&MonitorSample::itl_p99_ms), "ms");
  }
  if (last.gpu && ImGui::CollapsingHeader("GPU", ImGuiTreeNodeFlags_DefaultOpen)) {
    // NVML's figures; the memory alert's threshold is drawn.
    plot("GPU busy", data_.series(&MonitorSample::gpu_utilization), "", -1, 1.0f);
    plot("GPU temperature", data_.series(&MonitorSample::gpu_temperature_c), "C");
    plot("GPU memory", data_.series(&MonitorSample::gpu_memory_fraction), "", static_cast<float>(rules.memory_fraction), 1.0f);
  }
  if (ImGui::CollapsingHeader("Memory", ImGuiTreeNodeFlags_DefaultOpen)) {
    plot("KV used", data_.series(&MonitorSample::kv_used), "blocks");
    plot("KV cached", data_.series(&MonitorSample::kv_cached), "blocks");
    plot("KV free", data_.series(&MonitorSample::kv_free), "blocks");
    plot("KV memory", data_.series(&MonitorSample::memory_fraction), "", static_cast<float>(rules.memory_fraction), 1.0f);
    plot("process memory", data_.series(&MonitorSample::process_bytes), "bytes");
    // The device's memory in use, its total as the scale (the CPU's: the machine's RAM).
    plot("device memory", data_.series(&MonitorSample::device_used_bytes), "bytes", -1,
         static_cast<float>(last.device_total_bytes));
    ImGui::TextDisabled("device: %s used of %s", EngineMonitor::figure(last.device_used_bytes, "bytes").constData(),
                        EngineMonitor::figure(last.device_total_bytes, "bytes").constData());
    plot("error rate", data_.series(&MonitorSample::error_rate), "", static_cast<float>(rules.error_rate), 1.0f);
  }
  if (ImGui::CollapsingHeader("Alerts", ImGuiTreeNodeFlags_DefaultOpen)) {
    if (data_.alerts().empty()) ImGui::TextDisabled("none so far");
    for (auto it = data_.alerts().rbegin(); it != data_.alerts().rend(); ++it) {
      const bool active = std::find(data_.active_alerts().begin(), data_.active_alerts().end(), it->message) != data_.active_alerts().end();
      // Wrapped to the panel's width: a long alert is read whole, not clipped at the edge.
      ImGui::PushStyleColor(ImGuiCol_Text, active ? ImVec4(1.f, 0.45f, 0.4f, 1.f) : ImVec4(0.7f, 0.7f, 0.7f, 1.f));
      ImGui::TextWrapped("%.1f s  %s", it->t_s, it->message.c_str());
      ImGui::PopStyleColor();
    }
  }
  ImGui::End();
  ImGui::Render();
}

void EngineMonitor::paintGL() {
  QElapsedTimer t;
  t.start();
  ImGuiContext* previous = ImGui::GetCurrentContext();
  ImGui::SetCurrentContext(imgui_);
  ImGuiIO& io = ImGui::GetIO();
  const qreal dpr = devicePixelRatioF();
  io.DisplaySize = ImVec2(static_cast<float>(width()), static_cast<float>(height()));
  io.DisplayFramebufferScale = ImVec2(static_cast<float>(dpr), static_cast<float>(dpr));
  io.DeltaTime = lastFrame_.isValid() ? std::max(1e-4f, static_cast<float>(lastFrame_.restart()) / 1000.f) : 1.f / 30.f;
  if (!lastFrame_.isValid()) lastFrame_.start();
  if (rendererReady_) ImGui_ImplOpenGL3_NewFrame();
  else if (!io.Fonts->IsBuilt()) {
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);  // the frame is still built (and measured) without a renderer
  }
  buildFrame();
  const double buildMs = static_cast<double>(t.nsecsElapsed()) / 1e6;
  QOpenGLFunctions* gl = context()->functions();
  gl->glViewport(0, 0, static_cast<int>(width() * dpr), static_cast<int>(height() * dpr));
  gl->glClearColor(0.11f, 0.11f, 0.12f, 1.f);
  gl->glClear(GL_COLOR_BUFFER_BIT);
  if (rendererReady_) ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  ImGui::SetCurrentContext(previous ? previous : imgui_);
  frameMs_.push_back(static_cast<double>(t.nsecsElapsed()) / 1e6);
  buildMs_.push_back(buildMs);
  if (frameMs_.size() > kFrameWindow) frameMs_.erase(frameMs_.begin());
  if (buildMs_.size() > kFrameWindow) buildMs_.erase(buildMs_.begin());
}

EngineMonitor::FrameStats EngineMonitor::frameStats() const {
  FrameStats s;
  s.frames = static_cast<int>(frameMs_.size());
  s.median_ms = percentile(frameMs_, 0.5);
  s.p90_ms = percentile(frameMs_, 0.9);
  s.max_ms = frameMs_.empty() ? 0 : *std::max_element(frameMs_.begin(), frameMs_.end());
  s.build_median_ms = percentile(buildMs_, 0.5);
  return s;
}

void EngineMonitor::resetFrameStats() {
  frameMs_.clear();
  buildMs_.clear();
}

// Mouse input for ImGui (hover values, collapsing headers); 1.86 takes it as state.
void EngineMonitor::mouseMoveEvent(QMouseEvent* event) {
  if (!imgui_) return;
  ImGuiContext* previous = ImGui::GetCurrentContext();
  ImGui::SetCurrentContext(imgui_);
  ImGui::GetIO().MousePos = ImVec2(static_cast<float>(event->position().x()), static_cast<float>(event->position().y()));
  ImGui::SetCurrentContext(previous);
  update();
}

void EngineMonitor::mousePressEvent(QMouseEvent* event) {
  if (!imgui_) return;
  ImGuiContext* previous = ImGui::GetCurrentContext();
  ImGui::SetCurrentContext(imgui_);
  ImGuiIO& io = ImGui::GetIO();
  io.MousePos = ImVec2(static_cast<float>(event->position().x()), static_cast<float>(event->position().y()));
  if (event->button() == Qt::LeftButton) io.MouseDown[0] = true;
  if (event->button() == Qt::RightButton) io.MouseDown[1] = true;
  ImGui::SetCurrentContext(previous);
  update();
}

void EngineMonitor::mouseReleaseEvent(QMouseEvent* event) {
  if (!imgui_) return;
  ImGuiContext* previous = ImGui::GetCurrentContext();
  ImGui::SetCurrentContext(imgui_);
  ImGuiIO& io = ImGui::GetIO();
  if (event->button() == Qt::LeftButton) io.MouseDown[0] = false;
  if (event->button() == Qt::RightButton) io.MouseDown[1] = false;
  ImGui::SetCurrentContext(previous);
  update();
}

void EngineMonitor::wheelEvent(QWheelEvent* event) {
  if (!imgui_) return;
  ImGuiContext* previous = ImGui::GetCurrentContext();
  ImGui::SetCurrentContext(imgui_);
  ImGui::GetIO().MouseWheel += static_cast<float>(event->angleDelta().y()) / 120.f;
  ImGui::SetCurrentContext(previous);
  update();
}

}  // namespace atelier::ui
