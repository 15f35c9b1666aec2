//! `cargo run --release -p hpfsdp-reference --example matmul_bench`

fn main() {
    print!("{}", hpfsdp_reference::bench::matmul_bench_report());
}
