//! `cargo run --release -p hpfsdp-reference --example matmul_bench [-- --isa avx512|avx2-fma|portable]`
//!
//! `--isa` runs this crate's side with that kernel variant instead of the detected one (the
//! bits do not change, only the speed).

use hpfsdp_reference::Isa;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let isa = match args.as_slice() {
        [] => None,
        [flag, name] if flag == "--isa" => {
            let all = [Isa::Avx512, Isa::Avx2Fma, Isa::Portable];
            match all.into_iter().find(|i| i.name() == name) {
                Some(isa) => Some(isa),
                None => fail(&format!(
                    "--isa {name}: unknown kernel variant; use avx512, avx2-fma or portable"
                )),
            }
        }
        _ => fail("usage: matmul_bench [--isa avx512|avx2-fma|portable]"),
    };
    if let Err(e) = Isa::force(isa) {
        fail(&format!(
            "--isa: {e}; leave --isa out to use the detected kernel"
        ));
    }
    print!("{}", hpfsdp_reference::bench::matmul_bench_report());
}

fn fail(message: &str) -> ! {
    eprintln!("matmul_bench: {message}");
    std::process::exit(2)
}
