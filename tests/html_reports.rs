//! Every HTML report the CLI writes, rendered in headless Chromium: `simulate`, `verify`,
//! `calibrate`, `replay` and `sweep` (`collbench` writes a CSV only). For each page the test checks
//! that the browser logs no console message (the pages carry no script, so any message is an
//! error: a blocked resource, a parse failure), that the key numbers of the command's `--json`
//! output are in the rendered DOM, that no table is wider than a 1280-pixel window, that no
//! numeric cell wraps inside its value, and it saves a screenshot
//! (`target/tmp/html-reports/<command>.png`, or `$HPFSDP_SCREENSHOT_DIR`).
//!
//! Layout is measured by rendering a copy of the page with a small probe script appended: it
//! writes what it measured into a `data-hpfsdp-layout` attribute that `--dump-dom` returns.
//! The screenshot is taken of the unmodified page. A negative control (a page that logs a
//! console error) proves the console check can fail with the installed browser.
//!
//! Chromium is `$HPFSDP_CHROMIUM`, else the first of `chromium`, `chromium-browser`,
//! `google-chrome` on `PATH`. Without one the tests skip with a loud message, unless `CI` is
//! set: in CI a missing browser fails the test.

use hpfsdp_reports::units;
use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Window width of every render, pixels (a common laptop width).
const WIDTH_PX: u32 = 1280;
/// Window height of every render, pixels (the screenshot's height).
const HEIGHT_PX: u32 = 2400;
/// Longest a browser run may take before it is killed.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// Measures the rendered layout and records it on `<body>`: the window width, the tables
/// whose right edge passes it, numeric cells whose text spans more than one line, and the
/// right edge of the `fits` header (-1 when absent). No console output of its own.
const LAYOUT_PROBE: &str = r#"<script>
(function () {
  var width = document.documentElement.clientWidth;
  var wide = [];
  document.querySelectorAll('table').forEach(function (t, i) {
    var right = t.getBoundingClientRect().right;
    var box = t.parentElement;
    var clipped = box.scrollWidth > box.clientWidth + 1;
    if (right > width + 0.5 || clipped) {
      wide.push(i + '@' + Math.round(Math.max(right, box.getBoundingClientRect().left + box.scrollWidth)));
    }
  });
  var wrapped = [];
  document.querySelectorAll('td.num').forEach(function (td) {
    var range = document.createRange();
    range.selectNodeContents(td);
    var tops = {};
    Array.prototype.forEach.call(range.getClientRects(), function (r) {
      tops[Math.round(r.top)] = true;
    });
    if (Object.keys(tops).length > 1) { wrapped.push(td.textContent.replace(/[;=]/g, ' ')); }
  });
  var fits = -1;
  document.querySelectorAll('th').forEach(function (th) {
    if (th.textContent === 'fits' && fits < 0) { fits = Math.round(th.getBoundingClientRect().right); }
  });
  document.body.setAttribute('data-hpfsdp-layout',
    'width=' + width + ';wide=' + wide.join(',') + ';wrapped=' + wrapped.join('|') + ';fits=' + fits);
})();
</script>
"#;

/// The browser to use, or `None` (after a loud message) when there is none and `CI` is unset.
fn browser() -> Option<PathBuf> {
    let found = std::env::var_os("HPFSDP_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            ["chromium", "chromium-browser", "google-chrome"]
                .iter()
                .find_map(|name| on_path(name))
        });
    match found {
        Some(path) => Some(path),
        None if std::env::var_os("CI").is_some() => panic!(
            "CI is set but no Chromium was found: install it (apt-get install -y chromium) or \
             point HPFSDP_CHROMIUM at a Chromium binary"
        ),
        None => {
            // Written to the process's stderr directly: the test harness captures `eprintln!`
            // of passing tests, and this message must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "\n******************************************************************\n\
                 SKIPPED: HTML report rendering checks need Chromium (not found on PATH,\n\
                 HPFSDP_CHROMIUM unset). Install it: apt-get install -y chromium.\n\
                 In CI (CI set) this test fails instead of skipping.\n\
                 ******************************************************************\n"
            );
            None
        }
    }
}

/// `name` resolved on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-html-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Where screenshots are kept for a person to look at.
fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("HPFSDP_SCREENSHOT_DIR").map_or_else(
        || Path::new(env!("CARGO_TARGET_TMPDIR")).join("html-reports"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Runs the CLI from the repository root; panics with its stderr unless it exits with one of
/// `codes`; returns stdout parsed as JSON.
fn hpfsdp_json(args: &[&str], codes: &[i32]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run hpfsdp");
    let code = o.status.code().unwrap_or(-1);
    assert!(
        codes.contains(&code),
        "hpfsdp {args:?} exited {code}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("hpfsdp {args:?}: stdout is not JSON: {e}"))
}

/// What a browser run printed.
struct BrowserOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs the browser on `page` with `mode` (`--dump-dom` or `--screenshot=...`), killing it
/// after [`BROWSER_TIMEOUT`]. Output goes to files next to the profile (a pipe left unread
/// while waiting would block a large `--dump-dom`). Panics unless it exits successfully.
fn run_browser(browser: &Path, profile: &Path, mode: &str, page: &Path) -> BrowserOutput {
    let url = format!("file://{}", page.display());
    std::fs::create_dir_all(profile).expect("browser profile dir");
    let out_path = profile.join("stdout.txt");
    let err_path = profile.join("stderr.txt");
    let file = |p: &Path| std::fs::File::create(p).expect("browser log file");
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={WIDTH_PX},{HEIGHT_PX}"))
        .arg(mode)
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let start = Instant::now();
    let status = loop {
        match child.try_wait().expect("wait for the browser") {
            Some(status) => break status,
            None if start.elapsed() > BROWSER_TIMEOUT => {
                let _ = child.kill();
                panic!(
                    "{} {mode} {url}: no answer within {BROWSER_TIMEOUT:?}",
                    browser.display()
                );
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let output = BrowserOutput {
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    };
    assert!(
        status.success(),
        "{} {mode} {url} exited {status}:\n{}",
        browser.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The console messages in a browser's log (`INFO:CONSOLE...` lines and uncaught errors).
fn console_messages(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect()
}

/// What the layout probe measured.
#[derive(Debug)]
struct Layout {
    width_px: u32,
    wide_tables: String,
    wrapped_cells: String,
    fits_right_px: i64,
}

/// The rendered DOM's text and the layout of `html`, plus console messages of both renders;
/// the screenshot of the unmodified page is saved as `<name>.png`.
struct Rendered {
    dom: String,
    layout: Layout,
    console: Vec<String>,
    screenshot: PathBuf,
}

/// Renders `html` (a report file) twice: the page itself for a screenshot, a probed copy for
/// the DOM and layout.
fn render(browser: &Path, html: &Path, name: &str) -> Rendered {
    let work = scratch(&format!("render-{name}"));
    let text = std::fs::read_to_string(html).expect("read the report");
    assert!(text.contains("</body>"), "{}: no </body>", html.display());
    let probed = work.join("probed.html");
    std::fs::write(
        &probed,
        text.replacen("</body>", &format!("{LAYOUT_PROBE}</body>"), 1),
    )
    .expect("write probed copy");
    let dump = run_browser(browser, &work.join("profile-dom"), "--dump-dom", &probed);
    let screenshot = screenshot_dir().join(format!("{name}.png"));
    let _ = std::fs::remove_file(&screenshot);
    let shot = run_browser(
        browser,
        &work.join("profile-shot"),
        &format!("--screenshot={}", screenshot.display()),
        html,
    );
    let dom = String::from_utf8_lossy(&dump.stdout).into_owned();
    let layout =
        parse_layout(&dom).unwrap_or_else(|| panic!("{name}: the layout probe did not run"));
    let mut console = console_messages(&dump.stderr);
    console.extend(console_messages(&shot.stderr));
    let _ = std::fs::remove_dir_all(&work);
    Rendered {
        dom,
        layout,
        console,
        screenshot,
    }
}

/// Reads the probe's `data-hpfsdp-layout` attribute back from the dumped DOM.
fn parse_layout(dom: &str) -> Option<Layout> {
    let key = "data-hpfsdp-layout=\"";
    let start = dom.find(key)? + key.len();
    let value = &dom[start..start + dom[start..].find('"')?];
    let field = |name: &str| -> Option<String> {
        value
            .split(';')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=').map(str::to_string))
    };
    Some(Layout {
        width_px: field("width")?.parse().ok()?,
        wide_tables: field("wide")?,
        wrapped_cells: field("wrapped")?,
        fits_right_px: field("fits")?.parse().ok()?,
    })
}

/// The checks every report page must pass; returns the rendered DOM for content checks.
fn check_page(browser: &Path, html: &Path, name: &str) -> String {
    let r = render(browser, html, name);
    eprintln!("{name}: screenshot {}", r.screenshot.display());
    assert!(
        r.console.is_empty(),
        "{name}: console messages:\n{}",
        r.console.join("\n")
    );
    assert_png(&r.screenshot);
    assert!(
        r.layout.width_px >= WIDTH_PX - 32,
        "{name}: window narrower than asked: {:?}",
        r.layout
    );
    assert!(
        r.layout.wide_tables.is_empty(),
        "{name}: tables wider than the {} px page (index@right edge): {}",
        r.layout.width_px,
        r.layout.wide_tables
    );
    assert!(
        r.layout.wrapped_cells.is_empty(),
        "{name}: numeric cells wrapped inside their value: {}",
        r.layout.wrapped_cells
    );
    if r.layout.fits_right_px >= 0 {
        assert!(
            r.layout.fits_right_px <= i64::from(r.layout.width_px),
            "{name}: the fits column ends at {} px, past the page",
            r.layout.fits_right_px
        );
    }
    r.dom
}

/// A PNG of the window's size.
fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.len() > 1000, "{}: tiny screenshot", path.display());
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{}: not a PNG",
        path.display()
    );
    let width = u32::from_be_bytes(bytes[16..20].try_into().expect("IHDR width"));
    assert!(width >= WIDTH_PX, "{}: {width} px wide", path.display());
}

/// `needle` in the DOM as the browser serialises text (`&`, `<`, `>` escaped).
fn assert_in_dom(dom: &str, needle: &str, what: &str) {
    let escaped = needle
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(
        dom.contains(&escaped),
        "{what}: `{needle}` not in the rendered page"
    );
}

#[test]
fn the_console_check_sees_errors() {
    let Some(browser) = browser() else { return };
    let dir = scratch("negative");
    let page = dir.join("bad.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><p>x</p><script>console.error('hpfsdp-probe');\
         missingFunction();</script></body></html>",
    )
    .unwrap();
    let o = run_browser(&browser, &dir.join("profile"), "--dump-dom", &page);
    let messages = console_messages(&o.stderr);
    assert!(
        messages.iter().any(|m| m.contains("hpfsdp-probe"))
            && messages.iter().any(|m| m.contains("Uncaught")),
        "the browser's console log is not visible to this test: {messages:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_layout_probe_sees_wide_tables_and_wrapped_numbers() {
    let Some(browser) = browser() else { return };
    let dir = scratch("layout-negative");
    let cells: String = (0..40)
        .map(|i| format!("<td class=\"num\">{i}.000 GiB</td>"))
        .collect();
    let page = dir.join("wide.html");
    std::fs::write(
        &page,
        format!(
            "<!DOCTYPE html><html><body><div style=\"overflow-x:auto\"><table><tr>{cells}\
             </tr></table></div><table style=\"width:60px\"><tr><td class=\"num\">\
             123.456 GiB</td></tr></table></body></html>"
        ),
    )
    .unwrap();
    let r = render(&browser, &page, "negative-control");
    assert!(
        r.layout.wide_tables.starts_with("0@"),
        "a 40-column table was not seen as wider than the page: {:?}",
        r.layout
    );
    assert!(
        r.layout.wrapped_cells.contains("123.456 GiB"),
        "a wrapped numeric cell was not seen: {:?}",
        r.layout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn simulate_report_renders_with_its_numbers() {
    let Some(browser) = browser() else { return };
    let dir = scratch("simulate");
    let doc = hpfsdp_json(
        &[
            "simulate",
            "scenarios/verify/dense-hsdp2x4.toml",
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ],
        &[0],
    );
    let dom = check_page(&browser, &dir.join("report.html"), "simulate");
    let results = doc["results"].as_array().expect("results");
    assert!(!results.is_empty());
    for r in results {
        let name = r["strategy"].as_str().expect("strategy");
        assert_in_dom(&dom, name, "strategy");
        let step = r["step_time_s"].as_f64().expect("step");
        assert_in_dom(&dom, &units::ms(step), &format!("{name} step time (ms)"));
        let peak = r["peak_memory_bytes"].as_u64().expect("peak");
        assert_in_dom(&dom, &units::bytes(peak), &format!("{name} peak memory"));
    }
    assert_in_dom(&dom, units::SIZE_UNITS_NOTE, "unit convention");
    assert!(
        dom.contains("capacity "),
        "no device capacity on the memory chart"
    );
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    assert_eq!(trace["displayTimeUnit"], "ms", "trace timestamps are µs");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_report_renders_with_its_checks() {
    let Some(browser) = browser() else { return };
    let dir = scratch("verify");
    let doc = hpfsdp_json(
        &[
            "verify",
            "scenarios/verify/dense-fsdp4.toml",
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ],
        &[0, 1],
    );
    let dom = check_page(&browser, &dir.join("verify.html"), "verify");
    let report = &doc["report"];
    assert_in_dom(&dom, report["digest"].as_str().expect("digest"), "digest");
    let checks = report["checks"].as_array().expect("checks");
    for c in checks {
        assert_in_dom(&dom, c["name"].as_str().expect("name"), "check name");
    }
    if report["passed"].as_bool() == Some(true) {
        assert!(
            dom.contains("verdict pass"),
            "passing verify without a PASS banner"
        );
    } else {
        let banner = banner(&dom, "verdict fail");
        for c in checks
            .iter()
            .filter(|c| c["gating"] == true && c["passed"] == false)
        {
            let name = c["name"].as_str().unwrap();
            assert!(
                banner.contains(name),
                "FAIL banner does not name `{name}`: {banner}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibrate_report_renders_and_never_passes_over_a_failing_row() {
    let Some(browser) = browser() else { return };
    let dir = scratch("calibrate");
    let doc = hpfsdp_json(
        &["calibrate", "--json", "--out", dir.to_str().unwrap()],
        &[0, 1],
    );
    let dom = check_page(&browser, &dir.join("report.html"), "calibrate");
    assert!(dom.contains("<svg"), "no predicted-vs-measured chart");
    let rows = doc["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    let failing_gate = rows
        .iter()
        .any(|r| r["gating"] == true && r["passed"] == false);
    let any_out = rows.iter().any(|r| r["passed"] == false);
    if failing_gate {
        assert!(
            dom.contains("verdict fail"),
            "a gating row fails but the banner is not FAIL"
        );
    } else if any_out {
        assert!(
            dom.contains("verdict warn"),
            "rows out of tolerance under a plain PASS"
        );
    } else {
        assert!(dom.contains("verdict pass"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_report_renders_with_its_step_times() {
    let Some(browser) = browser() else { return };
    let dir = scratch("replay");
    let doc = hpfsdp_json(
        &[
            "replay",
            "scenarios/verify/dense-fsdp4.toml",
            "--backend",
            "inproc",
            "--steps",
            "1",
            "--timeout-s",
            "60",
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ],
        &[0],
    );
    let dom = check_page(&browser, &dir.join("report.html"), "replay");
    for side in ["measured", "predicted"] {
        let ns = doc[side]["step_ns"].as_u64().expect("step_ns");
        assert_in_dom(
            &dom,
            &units::ms(ns as f64 * 1e-9),
            &format!("{side} step (ms)"),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sweep_report_renders_with_its_points() {
    let Some(browser) = browser() else { return };
    let dir = scratch("sweep");
    let o = Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args([
            "sweep",
            "scenarios/verify/dense-fsdp4.toml",
            "--vary",
            "fsdp.prefetch_depth=0,1",
            "--vary",
            "train.micro_batch=1,3",
            "--out",
            dir.to_str().unwrap(),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run hpfsdp sweep");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dom = check_page(&browser, &dir.join("sweep.html"), "sweep");
    // Every feasible point's tokens/s (as sweep.csv has it) is on the page, and the invalid
    // points (micro batch 3 does not divide the global batch) are reported, not dropped.
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv");
    let mut feasible = 0;
    for row in csv.lines().skip(1) {
        let cells: Vec<&str> = row.split(',').collect();
        if cells[4] == "ok" {
            let tokens: f64 = cells[6].parse().expect("tokens_per_s");
            assert_in_dom(&dom, &format!("{tokens:.0}"), "a point's tokens/s");
            feasible += 1;
        }
    }
    assert!(feasible >= 2, "{csv}");
    assert!(
        dom.contains("invalid"),
        "the invalid points are not on the page"
    );
    assert!(
        dom.contains("best feasible point"),
        "no best point on the page"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The text of the first banner `<div class="{class}">` in the DOM.
fn banner<'a>(dom: &'a str, class: &str) -> &'a str {
    let start = dom
        .find(&format!("class=\"{class}\""))
        .unwrap_or_else(|| panic!("no `{class}` banner"));
    let rest = &dom[start..];
    &rest[..rest.find("</div>").unwrap_or(rest.len())]
}
