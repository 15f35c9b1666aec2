//! Issue 27's reproducers for files and counts (the replay/collbench counts live with those
//! commands' tests): `plan /dev/zero` used to read until memory ran out, `plan /dev/urandom`
//! never answered and a model path symlinked to them did the same; now every file a command
//! reads is refused unless it is a regular file under its size cap, with exit 2 naming the
//! file, what it is and the fix. A sweep's point count, `sweep --jobs` and `verify
//! --timeout-s` have limits; `dtype = "fp8"` is refused as not modelled.

mod common;

use common::hpfsdp;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts exit status 2, no panic, and every `needle` in stderr.
fn assert_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-cli-inputs-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `scenarios/verify/dense-fsdp4.toml` with its model line replaced by `model_line` and
/// `edit` applied, written to `dir/name`.
fn scenario(dir: &Path, name: &str, model_line: Option<&str>, edit: &[(&str, &str)]) -> String {
    let text = std::fs::read_to_string(root().join("scenarios/verify/dense-fsdp4.toml")).unwrap();
    let model = root().join("scenarios/verify/models/tiny-dense.toml");
    let default_line = format!("compact = \"{}\"", model.display());
    let mut text = text.replace(
        "compact = \"models/tiny-dense.toml\"",
        model_line.unwrap_or(&default_line),
    );
    for (from, to) in edit {
        assert!(text.contains(from), "no {from:?}");
        text = text.replace(from, to);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn devices_are_refused_as_scenarios_without_reading_them() {
    for dev in ["/dev/zero", "/dev/urandom"] {
        assert_error(
            &hpfsdp(&["plan", dev]),
            &[
                dev,
                "a character device",
                "not a regular file",
                "give the path of a scenario",
            ],
        );
    }
}

#[test]
fn a_model_path_symlinked_to_a_device_is_refused() {
    let dir = temp_dir("model-link");
    for (key, dev, ext) in [
        ("hf_config", "/dev/zero", "json"),
        ("compact", "/dev/urandom", "toml"),
    ] {
        let link = dir.join(format!("model-{key}.{ext}"));
        std::os::unix::fs::symlink(dev, &link).unwrap();
        let line = format!("{key} = \"{}\"", link.display());
        let s = scenario(&dir, &format!("{key}.toml"), Some(&line), &[]);
        assert_error(
            &hpfsdp(&["plan", &s]),
            &[
                &format!("[model] {key}"),
                &format!("resolves to {dev}"),
                "HF config.json",
            ],
        );
    }
}

#[test]
fn a_fifo_and_an_oversized_file_are_refused_at_once() {
    let dir = temp_dir("fifo-big");
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    assert_error(&hpfsdp(&["plan", fifo.to_str().unwrap()]), &["a FIFO"]);
    let big = dir.join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    assert_error(
        &hpfsdp(&["plan", big.to_str().unwrap()]),
        &[
            "big.toml",
            "more than 4,194,304 bytes (4 MiB)",
            "scenario file",
        ],
    );
    assert_error(
        &hpfsdp(&[
            "gate",
            "scenarios/verify/dense-fsdp4.toml",
            "--lock",
            "/dev/zero",
        ]),
        &["lock file /dev/zero", "a character device"],
    );
}

#[test]
fn calibrate_runs_files_must_be_regular_files_under_their_cap() {
    let dir = temp_dir("calibrate-runs");
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let big = dir.join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    let fifo = fifo.to_str().unwrap();
    let big = big.to_str().unwrap();
    let folder = dir.to_str().unwrap();
    for (path, what) in [
        ("/dev/zero", "a character device"),
        (fifo, "a FIFO"),
        (folder, "a directory"),
        (big, "more than 4,194,304 bytes (4 MiB)"),
    ] {
        let o = hpfsdp(&["calibrate", "--hardware", "ascend-910c-a3", "--runs", path]);
        assert_error(
            &o,
            &[
                &format!("--runs {path}"),
                "runs file",
                what,
                "a runs .toml file",
            ],
        );
    }
}

#[test]
fn a_sweep_past_its_point_limit_is_refused_before_any_point_is_built() {
    let many: String = (1..=300).map(|i| format!("{i},")).collect::<String>() + "301";
    let o = hpfsdp(&[
        "sweep",
        "scenarios/verify/dense-fsdp4.toml",
        "--vary",
        &format!("train.seq_len={many}"),
        "--vary",
        &format!("train.global_batch={many}"),
        "--out",
        temp_dir("sweep-points").to_str().unwrap(),
    ]);
    assert_error(
        &o,
        &[
            "--vary points 90601",
            "1..=65,536",
            "train.seq_len 301 x train.global_batch 301",
        ],
    );
}

#[test]
fn sweep_jobs_and_verify_timeout_are_bounded() {
    let out = temp_dir("sweep-jobs");
    for jobs in ["0", "100000"] {
        let o = hpfsdp(&[
            "sweep",
            "scenarios/verify/dense-fsdp4.toml",
            "--vary",
            "train.seq_len=32",
            "--jobs",
            jobs,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_error(&o, &[&format!("--jobs {jobs}"), "1..=1,024"]);
    }
    for t in ["1e300", "nan", "-1", "inf"] {
        let flag = format!("--timeout-s={t}");
        let o = hpfsdp(&["verify", "scenarios/verify/dense-fsdp4.toml", &flag]);
        assert_error(&o, &["--timeout-s", "up to 604800"]);
    }
}

#[test]
fn fp8_dtypes_are_refused_naming_the_key() {
    let dir = temp_dir("fp8");
    for (section, key, from) in [
        ("model", "dtype", "\ndtype = \"f32\""),
        ("fsdp", "param_dtype", "param_dtype = \"f32\""),
        ("fsdp", "reduce_dtype", "reduce_dtype = \"f32\""),
    ] {
        let to = from.replace("f32", "fp8");
        let s = scenario(&dir, &format!("{key}.toml"), None, &[(from, &to)]);
        let o = hpfsdp(&["plan", &s]);
        assert_error(
            &o,
            &[
                &format!("[{section}] {key} = \"fp8\""),
                "not modelled",
                "use bf16, f16 or f32",
            ],
        );
    }
}

#[test]
fn verify_help_names_both_optimizers() {
    let o = hpfsdp(&["verify", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("AdamW or Muon + AdamW"), "{help}");
}

#[test]
fn overrides_past_their_limit_and_duplicated_baselines_are_refused() {
    let dir = temp_dir("overrides");
    // 4,097 overrides: parsing them used to scan the file once per override (quadratic).
    let one =
        "\n[[plan.override]]\nmatch = \"model.no_such_module\"\nout_dst = { tp = \"replicate\" }\n";
    let many = scenario(&dir, "many.toml", None, &[]);
    let text = std::fs::read_to_string(&many).unwrap() + &one.repeat(4097);
    std::fs::write(&many, text).unwrap();
    assert_error(
        &hpfsdp(&["plan", &many]),
        &["[[plan.override]] entries = 4097", "0..=4,096"],
    );
    let twice = scenario(&dir, "twice.toml", None, &[]);
    let text = std::fs::read_to_string(&twice).unwrap();
    let text = if text.contains("baselines = [") {
        text.replacen("baselines = [", "baselines = [\"fsdp2\", \"fsdp2\", ", 1)
    } else {
        text.replace("[fsdp]\n", "[fsdp]\nbaselines = [\"fsdp2\", \"fsdp2\"]\n")
    };
    std::fs::write(&twice, text).unwrap();
    assert_error(
        &hpfsdp(&["plan", &twice]),
        &["[fsdp] baselines lists 'fsdp2' twice"],
    );
}
