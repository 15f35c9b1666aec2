//! The `hpfsdp` command line.
fn main() {
    println!("hpfsdp");
}
