// The engine monitor. Its data follows the engine's metrics: rates derived
// by hand from two metric snapshots (image steps/s, mean batch size from the
// histogram, error rate) and alerts logged once when they fire; with the
// real engine, after text and image jobs, its last sample holds the figures
// Engine::metrics() reports. Its UI-thread cost per frame at 30 frames per
// second, full plots, stays within 5 ms (median; figures printed).
//
// OpenGL: Qt's offscreen platform has none, so main() starts a private Xvfb
// (Mesa's llvmpipe) and runs this suite on it (xcb) when Xvfb is installed;
// without it the OpenGL tests are skipped and say so.
#include <QAction>
#include <QApplication>
#include <QDockWidget>
#include <QElapsedTimer>
#include <QProcess>
#include <QSignalSpy>
#include <QtTest>

#include <cmath>
#include <ctime>
#include <memory>


#include "bridge/engine_bridge.h"
#include "monitor/engine_monitor.h"
#include "monitor/monitor_data.h"
#include "studio/studio_window.h"
#include "ui/ui_test_util.h"

using namespace atelier;
using namespace atelier::ui;

class MonitorTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;

 private slots:
  void initTestCase() {
    home_ = std::make_unique<uitest::TestHome>();
    QVERIFY(home_->pull({QStringLiteral("stories260k"), QStringLiteral("quickdraw")}));
  }

  void ratesAreDerivedFromTheCounters() {
    MonitorData d;
    EngineMetrics a;
    a.image_steps = 10;
    a.batch_size_histogram = {0, 4, 0, 2};  // 4 steps of 1, 2 steps of 3
    a.completed = 5;
    a.failed = 1;
    a.kv_blocks_used = 30;
    a.kv_blocks_free = 70;
    d.add(a, 1.0, 2, 1);
    EngineMetrics b = a;
    b.image_steps = 16;                     // 6 steps in 2 s
    b.batch_size_histogram = {0, 4, 3, 6};  // +3 steps of 2, +4 steps of 3: (6 + 12) / 7
    b.completed = 8;                        // +3
    b.failed = 2;                           // +1: 1 / 4
    b.kv_blocks_used = 95;
    b.kv_blocks_free = 5;
    b.active_alerts = {"memory over 90%"};
    d.add(b, 3.0, 0, 4);
    b.active_alerts = {"memory over 90%"};  // still active: logged once
    d.add(b, 3.5, 0, 4);
    QCOMPARE(d.samples().size(), size_t{3});
    const MonitorSample& s = d.samples()[1];
    QCOMPARE(s.image_steps_per_s, 3.0);
    QCOMPARE(s.batch_mean, 18.0 / 7.0);
    QCOMPARE(s.error_rate, 0.25);
    QCOMPARE(s.memory_fraction, 0.95);
    QCOMPARE(s.queued_text, 0);
    QCOMPARE(s.queued_image, 4);
    QCOMPARE(d.samples()[0].memory_fraction, 0.30);
    QCOMPARE(d.samples()[2].image_steps_per_s, 0.0);  // nothing new in the last half second
    QCOMPARE(d.alerts().size(), size_t{1});
    QCOMPARE(d.alerts()[0].t_s, 3.0);
    // A restarted engine's counters start again at 0: no negative rate.
    EngineMetrics c;
    d.add(c, 4.0, 0, 0);
    QCOMPARE(d.samples().back().image_steps_per_s, 0.0);
    QCOMPARE(d.series(&MonitorSample::queued_image), (std::vector<float>{1, 4, 4, 0}));
  }

  // Issue 33: a GPU's sensors reach the samples (the panel's GPU section and
  // its 90 % memory line); the CPU has none.
  void gpuSensorsReachTheSamples() {
    MonitorData d;
    EngineMetrics cpu;
    d.add(cpu, 1.0, 0, 0);
    QVERIFY(!d.samples().back().gpu);
    EngineMetrics g;
    g.telemetry_available = true;
    g.device_utilization_percent = 85;
    g.device_temperature_c = 71;
    g.device_memory_total_bytes = int64_t{80} << 30;
    g.device_memory_used_bytes = int64_t{76} << 30;
    d.add(g, 2.0, 0, 0);
    const MonitorSample& s = d.samples().back();
    QVERIFY(s.gpu);
    QCOMPARE(s.gpu_utilization, 0.85);
    QCOMPARE(s.gpu_temperature_c, 71.0);
    QCOMPARE(s.gpu_memory_fraction, 0.95);
    QVERIFY(!s.same_figures(d.samples()[0]));
  }

  // Issue 35: the device's memory (it read 0: the metrics had none) and a busy
  // engine while only image jobs ran (busy counted text steps only).
  void deviceMemoryAndBusyDuringImageJobs() {
    MonitorData d;
    EngineMetrics m;
    m.device_memory_total_bytes = int64_t{16} << 30;
    m.device_memory_free_bytes = (int64_t{10} << 30) + 4096;
    d.add(m, 1.0, 0, 0);
    QCOMPARE(d.samples().back().device_total_bytes, 16.0 * (1 << 30));
    QCOMPARE(d.samples().back().device_used_bytes, 6.0 * (1 << 30));
    m.device_memory_free_bytes -= 12288;  // the kernel's figure drifts by pages: the same figure
    d.add(m, 1.5, 0, 0);
    QCOMPARE(d.samples()[1].device_used_bytes, d.samples()[0].device_used_bytes);
    m.device_memory_free_bytes -= int64_t{1} << 30;  // and other programs move it: not a reason to redraw at once
    d.add(m, 2.0, 0, 0);
    QCOMPARE(d.samples()[2].device_used_bytes, 7.0 * (1 << 30));
    QVERIFY(d.samples()[2].same_figures(d.samples()[1]));

    bridge::EngineBridge::Options o;
    o.dataDir = home_->home();
    o.pollMs = 100;
    bridge::EngineBridge engine(o);
    QSignalSpy opened(&engine, &bridge::EngineBridge::opened);
    engine.start();
    QVERIFY(opened.wait(20000));
    EngineMonitor monitor(&engine);
    JobId id = 0;
    ImageRequest img;
    img.model = "quickdraw";
    img.prompt = "apple";
    img.batch_count = 4;
    engine.submitImage(img, [&](Result<JobId> got) { id = got.ok() ? got.value() : -1; });
    QTRY_VERIFY_WITH_TIMEOUT(id != 0, 10000);
    QVERIFY(id > 0);
    auto state = [&] {
      for (const JobInfo& j : engine.jobs())
        if (j.id == id) return j.state;
      return JobState::Queued;
    };
    QTRY_COMPARE_WITH_TIMEOUT(state(), JobState::Completed, 60000);
    // Within the busy figure's 10 s window of the job's model calls.
    const int before = monitor.polls();
    monitor.pollNow();
    QTRY_VERIFY_WITH_TIMEOUT(monitor.polls() > before, 10000);
    const MonitorSample s = monitor.data().samples().back();
    QVERIFY2(s.busy_fraction > 0, "only an image job ran, and the engine looked idle");
    QVERIFY2(s.device_total_bytes >= 64.0 * (1 << 20), qPrintable(EngineMonitor::figure(s.device_total_bytes, "bytes")));
    QVERIFY(s.device_used_bytes > 0 && s.device_used_bytes <= s.device_total_bytes);
  }

  void theDataFollowsTheEngine() {
    bridge::EngineBridge::Options o;
    o.dataDir = home_->home();
    o.pollMs = 100;
    bridge::EngineBridge engine(o);
    QSignalSpy opened(&engine, &bridge::EngineBridge::opened);
    engine.start();
    QVERIFY(opened.wait(20000));
    EngineMonitor monitor(&engine);
    QVector<JobId> ids;
    for (int i = 0; i < 4; ++i) {
      TextRequest r;
      r.model = "stories260k";
      r.prompt = "Once upon a time";
      r.max_new_tokens = 24;
      engine.submitText(r, [&](Result<JobId> got) { ids.push_back(got.ok() ? got.value() : -1); });
    }
    ImageRequest img;
    img.model = "quickdraw";
    img.prompt = "apple";
    engine.submitImage(img, [&](Result<JobId> got) { ids.push_back(got.ok() ? got.value() : -1); });
    QTRY_COMPARE_WITH_TIMEOUT(ids.size(), 5, 10000);
    auto allDone = [&] {
      int done = 0;
      for (const JobInfo& j : engine.jobs())
        if (ids.contains(j.id) && j.state == JobState::Completed) ++done;
      return done == 5;
    };
    QTRY_VERIFY_WITH_TIMEOUT(allDone(), 60000);
    // The engine's own figures, read now that it is idle, before and after
    // the monitor's sample (windowed figures may age between reads: the
    // sample must equal one of the two; the busy fraction, a 10 s window,
    // decays while idle and is not compared).
    auto readMetrics = [&] {
      EngineMetrics m;
      bool got = false;
      engine.run<EngineMetrics>([](Engine* e) { return e->metrics(); }, [&](EngineMetrics v) {
        m = v;
        got = true;
      });
      [&] { QTRY_VERIFY_WITH_TIMEOUT(got, 10000); }();
      return m;
    };
    const EngineMetrics a = readMetrics();
    const int before = monitor.polls();
    monitor.pollNow();
    QTRY_VERIFY_WITH_TIMEOUT(monitor.polls() > before, 10000);
    const EngineMetrics b = readMetrics();
    const MonitorSample s = monitor.data().samples().back();
    auto matches = [&](const EngineMetrics& t) {
      return s.kv_used == t.kv_blocks_used && s.kv_free == t.kv_blocks_free && s.kv_cached == t.kv_blocks_cached &&
             s.ttft_p50_ms == t.time_to_first_token_ms.p50 && s.ttft_p99_ms == t.time_to_first_token_ms.p99 &&
             s.itl_p50_ms == t.inter_token_ms.p50 && s.itl_p99_ms == t.inter_token_ms.p99;
    };
    QVERIFY(a.completed >= 5);
    QVERIFY(a.time_to_first_token_ms.p50 > 0);
    QVERIFY(a.kv_blocks_used + a.kv_blocks_free > 0);
    QVERIFY2(matches(a) || matches(b), qPrintable(QStringLiteral("monitor kv %1/%2/%3 ttft %4, engine kv %5/%6/%7 ttft %8")
                                                     .arg(s.kv_used).arg(s.kv_cached).arg(s.kv_free).arg(s.ttft_p50_ms)
                                                     .arg(a.kv_blocks_used).arg(a.kv_blocks_cached).arg(a.kv_blocks_free)
                                                     .arg(a.time_to_first_token_ms.p50)));
    QCOMPARE(s.queued_text + s.queued_image, 0);
  }

  void aFrameCostsTheUiThreadAtMost5ms() {
    if (!EngineMonitor::openGLAvailable()) QSKIP("no OpenGL here (install xvfb and Mesa); the frame cost is not measured");
    MonitorData full;
    EngineMetrics m;
    m.batch_size_histogram.assign(33, 0);
    for (size_t i = 0; i < MonitorData::kCapacity; ++i) {
      // Moving figures, so every plot has a full, changing line.
      m.tokens_per_s = 100 + 50 * std::sin(static_cast<double>(i) / 10);
      m.recent_tokens_per_s = 110;
      m.image_steps += static_cast<int64_t>(i % 3);
      m.batch_size_histogram[1 + i % 32] += 1;
      m.time_to_first_token_ms = {20.0 + static_cast<double>(i % 7), 80.0};
      m.inter_token_ms = {5.0 + static_cast<double>(i % 5), 12.0};
      m.kv_blocks_used = static_cast<int>(i % 100);
      m.kv_blocks_free = 100 - m.kv_blocks_used;
      m.busy_fraction = 0.5;
      if (i % 100 == 0) m.active_alerts = {"alert " + std::to_string(i)};
      full.add(m, static_cast<double>(i) * 0.25, static_cast<int>(i % 9), static_cast<int>(i % 2));
    }
    EngineMonitor monitor(nullptr);  // no engine: the frames draw the data above
    monitor.data() = full;
    monitor.resize(520, 900);
    monitor.show();
    QVERIFY(QTest::qWaitForWindowExposed(&monitor));
    QTRY_VERIFY_WITH_TIMEOUT(monitor.frameStats().frames >= 1, 10000);
    QVERIFY2(monitor.rendererReady(), "ImGui's OpenGL3 renderer did not start");
    monitor.resetFrameStats();
    // The panel redraws only when its data changes (a few times a second at most): frames are asked for here,
    // one after another, so their cost is measured whatever the machine's load.
    for (int i = 0; i < 60; ++i) {
      monitor.update();
      QTRY_COMPARE_WITH_TIMEOUT(monitor.frameStats().frames, i + 1, 5000);
    }
    const auto st = monitor.frameStats();
    qInfo("engine monitor: %d frames; UI-thread ms per frame: median %.2f, p90 %.2f, max %.2f "
          "(building the ImGui frame: median %.2f); limit 5 ms (%.0f%% of it)",
          st.frames, st.median_ms, st.p90_ms, st.max_ms, st.build_median_ms, 100.0 * st.median_ms / 5.0);
    QCOMPARE(st.frames, 60);
    QVERIFY2(st.median_ms <= 5.0, qPrintable(QStringLiteral("median %1 ms per frame").arg(st.median_ms)));
    // What it drew, for people to look at (the plots are not compared by pixels).
    const QImage frame = monitor.grabFramebuffer();
    QVERIFY(!frame.isNull());
    frame.save(QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("monitor-frame.png")));
    QSet<QRgb> colours;
    for (int y = 0; y < frame.height(); y += 4)
      for (int x = 0; x < frame.width(); x += 4) colours.insert(frame.pixel(x, y));
    QVERIFY2(colours.size() > 20, "the panel is blank");  // plots and text, not one clear colour
  }

  void theStudioOpensTheMonitorFromView() {
    if (!EngineMonitor::openGLAvailable()) QSKIP("no OpenGL here (install xvfb and Mesa)");
    StudioOptions o;
    o.dataDir = home_->home();
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    QVERIFY(!w.monitorDock()->isVisible());
    // View > Engine monitor (Ctrl+Shift+E; no window manager here gives the window focus for the key itself).
    auto* action = w.findChild<QAction*>(QStringLiteral("actionMonitor"));
    QVERIFY(action);
    QCOMPARE(action->shortcut(), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_E));
    action->trigger();
    QTRY_VERIFY_WITH_TIMEOUT(w.monitorDock()->isVisible(), 5000);
    const int before = w.monitor()->polls();
    QTRY_VERIFY_WITH_TIMEOUT(w.monitor()->polls() >= before + 2, 5000);  // polling while shown
  }

  // An idle studio with the monitor's dock open costs under 2 % of a core
  // (the panel used to redraw at 30 fps through llvmpipe: 73-87 %): it
  // redraws only when its data changed, at most at the poll rate, and not
  // at all while another dock tab covers it. Its figures are readable.
  void anIdleMonitorCostsUnder2PercentOfACore() {
    if (!EngineMonitor::openGLAvailable()) QSKIP("no OpenGL here (install xvfb and Mesa)");
    StudioOptions o;
    o.dataDir = home_->home();
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    w.findChild<QAction*>(QStringLiteral("actionMonitor"))->trigger();
    QTRY_VERIFY_WITH_TIMEOUT(w.monitorDock()->isVisible(), 5000);
    QTRY_VERIFY_WITH_TIMEOUT(w.monitor()->frameStats().frames >= 1, 10000);
    // The process's memory is a figure of its own, not 0.
    QTRY_VERIFY_WITH_TIMEOUT(!w.monitor()->data().samples().empty(), 5000);
    QVERIFY(w.monitor()->data().samples().back().process_bytes > (int64_t{1} << 20));
    QTest::qWait(1500);  // opening settles (the first samples differ: rates start from nothing)
    w.monitor()->resetFrameStats();
    const int polls = w.monitor()->polls();
    timespec a{}, b{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    QElapsedTimer wall;
    wall.start();
    QTest::qWait(10000);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    const double cpu_s = static_cast<double>(b.tv_sec - a.tv_sec) + static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e9;
    const double share = cpu_s / (static_cast<double>(wall.elapsed()) / 1000.0);
    const int frames = w.monitor()->frameStats().frames;
    qInfo("idle studio, monitor dock open: %.3f s of CPU in %.1f s (%.2f %% of a core), %d frames, %d polls", cpu_s,
          static_cast<double>(wall.elapsed()) / 1000.0, 100.0 * share, frames, w.monitor()->polls() - polls);
    QVERIFY(w.monitor()->polls() - polls >= 10);  // still watching the engine
    QVERIFY2(frames <= 10, qPrintable(QString::number(frames)));  // nothing changed: (almost) nothing drawn
    QVERIFY2(share < 0.02, qPrintable(QStringLiteral("%1 %").arg(100.0 * share)));
    // Behind another dock tab: no polls, no frames.
    w.galleryDock()->raise();
    QTRY_VERIFY_WITH_TIMEOUT(w.monitor()->visibleRegion().isEmpty(), 5000);
    QTest::qWait(300);
    const int hiddenPolls = w.monitor()->polls();
    w.monitor()->resetFrameStats();
    QTest::qWait(1500);
    QCOMPARE(w.monitor()->polls(), hiddenPolls);
    QCOMPARE(w.monitor()->frameStats().frames, 0);
  }

  // Figures as plain numbers with their units, never 2.62e+04.
  void figuresArePlainNumbersWithUnits() {
    QCOMPARE(EngineMonitor::figure(26200, "tok/s"), QByteArray("26200 tok/s"));
    QCOMPARE(EngineMonitor::figure(12.345, "ms"), QByteArray("12.3 ms"));
    QCOMPARE(EngineMonitor::figure(0.5, ""), QByteArray("0.50"));
    QCOMPARE(EngineMonitor::figure(3.0 * (1 << 30), "bytes"), QByteArray("3.00 GiB"));
    QCOMPARE(EngineMonitor::figure(512.0 * (1 << 20), "bytes"), QByteArray("512 MiB"));
  }
};

// A private X server for OpenGL (see above), started before QApplication.
int main(int argc, char** argv) {
  std::unique_ptr<QProcess> xvfb;
  if (qEnvironmentVariableIsEmpty("DISPLAY") && !QStandardPaths::findExecutable(QStringLiteral("Xvfb")).isEmpty()) {
    xvfb = std::make_unique<QProcess>();
    xvfb->setProcessChannelMode(QProcess::SeparateChannels);
    // -displayfd 1: Xvfb picks a free display and prints its number once it accepts connections.
    // -noreset: a client connecting while Xvfb resets (after its last client left) is dropped.
    xvfb->start(QStringLiteral("Xvfb"), {QStringLiteral("-displayfd"), QStringLiteral("1"), QStringLiteral("-noreset"), QStringLiteral("-screen"),
                                          QStringLiteral("0"), QStringLiteral("1280x1024x24"), QStringLiteral("-nolisten"), QStringLiteral("tcp")});
    QByteArray number;
    if (xvfb->waitForStarted(10000))
      for (int i = 0; i < 200 && !number.contains('\n') && xvfb->state() == QProcess::Running; ++i)
        if (xvfb->waitForReadyRead(100)) number += xvfb->readAllStandardOutput();
    if (number.contains('\n')) {
      qputenv("DISPLAY", QByteArray(":") + number.trimmed());
      qputenv("QT_QPA_PLATFORM", "xcb");  // Qt's offscreen platform has no OpenGL
    }
  }
  int rc = 0;
  {
    QApplication app(argc, argv);
    MonitorTest test;
    rc = QTest::qExec(&test, argc, argv);
  }
  if (xvfb) {
    xvfb->terminate();
    xvfb->waitForFinished(5000);
  }
  return rc;
}

#include "monitor_test.moc"
