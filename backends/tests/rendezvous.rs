//! The unique-id rendezvous (file and TCP stores) with threads as ranks, and its errors.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hpfsdp_backends::device::{
    FileStore, IdExchange, KeyValueStore, StoreExchange, TcpStore, WorldSpec, exchange_from_lookup,
};
use hpfsdp_backends::{CommError, Group};

const WAIT: Duration = Duration::from_secs(20);

fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rendezvous-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The blob rank `r` would create (distinct per rank and per round).
fn blob(r: usize, round: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8) ^ (r as u8).wrapping_mul(31) ^ round)
        .collect()
}

/// Every rank runs two world broadcasts and one group broadcast over `make(rank)`; returns
/// what each rank ended up with.
fn exercise(n: usize, make: impl Fn(usize) -> Box<dyn IdExchange> + Sync) -> Vec<Vec<Vec<u8>>> {
    let group = Group::new("odd", (1..n).step_by(2).collect()).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (make, group) = (&make, &group);
                s.spawn(move || {
                    let ex = make(r);
                    let mut got = Vec::new();
                    for (round, len) in [(0u8, 128usize), (1, 4108)] {
                        let mut b = if r == 0 {
                            blob(r, round, len)
                        } else {
                            vec![0; len]
                        };
                        ex.broadcast_id(&mut b).unwrap();
                        got.push(b);
                    }
                    if group.contains(r) {
                        let mut b = if r == group.ranks()[0] {
                            blob(r, 9, 128)
                        } else {
                            vec![0; 128]
                        };
                        ex.broadcast_group_id("nccl-odd", group, &mut b).unwrap();
                        got.push(b);
                    }
                    got
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check(n: usize, got: &[Vec<Vec<u8>>]) {
    for (r, g) in got.iter().enumerate() {
        assert_eq!(g[0], blob(0, 0, 128), "rank {r} round 0");
        assert_eq!(g[1], blob(0, 1, 4108), "rank {r} round 1");
        if r % 2 == 1 {
            assert_eq!(g[2], blob(1, 9, 128), "rank {r} group");
        } else {
            assert_eq!(g.len(), 2, "rank {r} is not in the group");
        }
    }
    assert_eq!(got.len(), n);
}

#[test]
fn file_store_carries_world_and_group_ids_between_threads() {
    let dir = fresh_dir("file");
    let got = exercise(6, |r| {
        Box::new(StoreExchange::new(FileStore::new(&dir).unwrap(), r, WAIT))
    });
    check(6, &got);
    // Counted keys: two world exchanges and one group exchange, no temporary files left.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["group-nccl-odd.0.id", "world.0.id", "world.1.id"]);
}

#[test]
fn tcp_store_carries_world_and_group_ids_between_threads() {
    let server = TcpStore::serve("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let server = std::sync::Mutex::new(Some(server));
    let got = exercise(5, |r| {
        let store = if r == 0 {
            server.lock().unwrap().take().unwrap()
        } else {
            TcpStore::connect(&addr).unwrap()
        };
        Box::new(StoreExchange::new(store, r, WAIT))
    });
    check(5, &got);
}

#[test]
fn tcp_clients_wait_for_a_server_that_starts_late() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let got = exercise(3, |r| {
        let store = if r == 0 {
            std::thread::sleep(Duration::from_millis(300));
            TcpStore::serve(&addr).unwrap()
        } else {
            TcpStore::connect(&addr).unwrap()
        };
        Box::new(StoreExchange::new(store, r, WAIT))
    });
    check(3, &got);
}

#[test]
fn a_key_that_never_appears_times_out_with_a_clear_message() {
    let store = FileStore::new(fresh_dir("timeout")).unwrap();
    let start = Instant::now();
    let e = store
        .get("world.0", Duration::from_millis(100))
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(100));
    let msg = e.to_string();
    assert!(msg.contains("world.0.id") && msg.contains("0.1 s"), "{msg}");
    let server = TcpStore::serve("127.0.0.1:0").unwrap();
    let client = TcpStore::connect(&server.local_addr().unwrap().to_string()).unwrap();
    let msg = client
        .get("absent", Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("key absent was not published"), "{msg}");
}

#[test]
fn foreign_or_mis_sized_values_are_rejected() {
    let store = FileStore::new(fresh_dir("foreign")).unwrap();
    std::fs::write(store.path_of("world.0"), b"junk").unwrap();
    let msg = store.get("world.0", WAIT).unwrap_err().to_string();
    assert!(
        msg.contains("not a rendezvous file written by hpfsdp"),
        "{msg}"
    );
    // A 128-byte NCCL id where a 4108-byte HCCL root info is expected.
    let dir = fresh_dir("mis-sized");
    FileStore::new(&dir)
        .unwrap()
        .put("world.0", &[7u8; 128])
        .unwrap();
    let ex = StoreExchange::new(FileStore::new(&dir).unwrap(), 1, WAIT);
    let msg = ex.broadcast_id(&mut [0u8; 4108]).unwrap_err().to_string();
    assert!(
        msg.contains("holds 128 bytes but 4108 were expected"),
        "{msg}"
    );
}

#[test]
fn a_non_member_cannot_take_part_in_a_group_exchange() {
    let ex = StoreExchange::new(FileStore::new(fresh_dir("non-member")).unwrap(), 0, WAIT);
    let g = Group::new("tp", vec![1, 2]).unwrap();
    let e = ex.broadcast_group_id("k", &g, &mut [0u8; 8]).unwrap_err();
    assert!(matches!(e, CommError::NotInGroup { rank: 0, .. }), "{e:?}");
}

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

#[test]
fn the_environment_chooses_the_rendezvous() {
    let two = WorldSpec::new(1, 2, 0).unwrap();
    let msg = exchange_from_lookup(&two, &lookup(&[]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("HPFSDP_RENDEZVOUS=file:") && msg.contains("2 ranks"),
        "{msg}"
    );
    let one = WorldSpec::single();
    assert_eq!(
        exchange_from_lookup(&one, &lookup(&[])).unwrap().method(),
        "local"
    );
    let msg = exchange_from_lookup(&two, &lookup(&[("HPFSDP_RENDEZVOUS", "nfs:/x")]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("neither file:/path nor tcp:host:port"),
        "{msg}"
    );
    let dir = fresh_dir("env");
    let spec = format!("file:{}", dir.display());
    let ex = exchange_from_lookup(&two, &lookup(&[("HPFSDP_RENDEZVOUS", &spec)])).unwrap();
    assert_eq!(ex.method(), spec);
    let torchrun = lookup(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
    assert_eq!(
        exchange_from_lookup(&two, &torchrun).unwrap().method(),
        "tcp:127.0.0.1:29501"
    );
    let bad = lookup(&[
        ("HPFSDP_RENDEZVOUS", &spec),
        ("HPFSDP_RENDEZVOUS_TIMEOUT_S", "soon"),
    ]);
    let msg = exchange_from_lookup(&two, &bad).err().unwrap().to_string();
    assert!(
        msg.contains("HPFSDP_RENDEZVOUS_TIMEOUT_S=\"soon\""),
        "{msg}"
    );
}

#[test]
fn a_second_communicator_on_the_same_store_gets_fresh_keys() {
    let dir = fresh_dir("second");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    for round in 0..2u8 {
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let (dir, addr) = (&dir, &addr);
                    s.spawn(move || {
                        let file = StoreExchange::new(FileStore::new(dir).unwrap(), r, WAIT);
                        // Rank 0 serves the same address again: the process shares its server.
                        let tcp = if r == 0 {
                            TcpStore::serve(addr)
                        } else {
                            TcpStore::connect(addr)
                        };
                        let tcp = StoreExchange::new(tcp.unwrap(), r, WAIT);
                        let mut a = if r == 0 {
                            blob(0, round, 16)
                        } else {
                            vec![0; 16]
                        };
                        file.broadcast_id(&mut a).unwrap();
                        let mut b = if r == 0 {
                            blob(0, round + 10, 16)
                        } else {
                            vec![0; 16]
                        };
                        tcp.broadcast_id(&mut b).unwrap();
                        [a, b].concat()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want = [blob(0, round, 16), blob(0, round + 10, 16)].concat();
        assert_eq!(got, vec![want.clone(), want], "round {round}");
    }
    assert!(
        dir.join("world.1.id").exists(),
        "the second round used the next key"
    );
}
