//! Tests: small profiles built byte by byte, real profiles written by
//! clang and rustc, malformed inputs and llvm-profdata merge rules.

use std::collections::HashSet;
use std::io::Write;

use super::*;
use crate::bytes::Endian;

// ---------------------------------------------------------------------------
// A tiny raw profile writer.

struct W {
    buf: Vec<u8>,
    endian: Endian,
}

impl W {
    fn new(endian: Endian) -> Self {
        W {
            buf: Vec::new(),
            endian,
        }
    }
    fn u16(&mut self, v: u16) {
        let b = match self.endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        self.buf.extend_from_slice(&b);
    }
    fn u32(&mut self, v: u32) {
        let b = match self.endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        self.buf.extend_from_slice(&b);
    }
    fn u64(&mut self, v: u64) {
        let b = match self.endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        self.buf.extend_from_slice(&b);
    }
    fn ptr(&mut self, is_64: bool, v: u64) {
        if is_64 {
            self.u64(v)
        } else {
            self.u32(v as u32)
        }
    }
    fn pad8(&mut self) {
        while self.buf.len() % 8 != 0 {
            self.buf.push(0);
        }
    }
}

fn uleb(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn names_chunk(names: &[&str], compress: bool) -> Vec<u8> {
    let text = names.join("\u{1}");
    let mut out = Vec::new();
    uleb(text.len() as u64, &mut out);
    if compress {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(text.as_bytes()).unwrap();
        let packed = z.finish().unwrap();
        uleb(packed.len() as u64, &mut out);
        out.extend_from_slice(&packed);
    } else {
        uleb(0, &mut out);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// A value-profile blob with one record per (kind, per-site value counts).
fn value_blob(endian: Endian, kinds: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut body = W::new(endian);
    for (kind, sites) in kinds {
        body.u32(*kind);
        body.u32(sites.len() as u32);
        body.buf.extend_from_slice(sites);
        body.pad8();
        for _ in 0..sites.iter().map(|&n| n as usize).sum::<usize>() {
            body.u64(0x1234); // value
            body.u64(7); // count
        }
    }
    let mut w = W::new(endian);
    w.u32(8 + body.buf.len() as u32);
    w.u32(kinds.len() as u32);
    w.buf.extend_from_slice(&body.buf);
    w.buf
}

#[derive(Clone)]
struct TFn {
    name: &'static str,
    hash: u64,
    /// Counter slot values (bytes in byte-coverage mode).
    slots: Vec<u64>,
    timestamp: u64,
    bitmap: Vec<u8>,
    sites: [u16; 3],
    values: Vec<u8>,
}

fn tfn(name: &'static str, hash: u64, slots: &[u64]) -> TFn {
    TFn {
        name,
        hash,
        slots: slots.to_vec(),
        timestamp: 0,
        bitmap: vec![],
        sites: [0; 3],
        values: vec![],
    }
}

#[derive(Clone)]
struct Spec {
    version: u32,
    flags: u64,
    is_64: bool,
    endian: Endian,
    binary_ids: Vec<Vec<u8>>,
    fns: Vec<TFn>,
    /// Names written to the names section (default: the functions' names).
    names: Option<Vec<&'static str>>,
    compress_names: bool,
    counters_before_data: bool,
    num_vtables: u64,
    vnames: Vec<&'static str>,
}

fn spec(version: u32, fns: Vec<TFn>) -> Spec {
    Spec {
        version,
        flags: 0,
        is_64: true,
        endian: Endian::Little,
        binary_ids: vec![],
        fns,
        names: None,
        compress_names: false,
        counters_before_data: true,
        num_vtables: 0,
        vnames: vec![],
    }
}

fn write(s: &Spec) -> Vec<u8> {
    let v = s.version;
    let byte = s.flags & BYTE_COVERAGE != 0;
    let temporal = s.flags & TEMPORAL != 0;
    let width = if byte { 1 } else { 8 };
    let rec = raw::record_size(v, s.is_64) as u64;

    // Counters and bitmap images, and where each function's part starts.
    let mut counters = W::new(s.endian);
    let mut counter_offsets = vec![];
    let mut bitmap = vec![];
    let mut bitmap_offsets = vec![];
    for f in &s.fns {
        counter_offsets.push(counters.buf.len() as u64);
        if temporal {
            counters.u64(f.timestamp);
        }
        for &c in &f.slots {
            if byte {
                counters.buf.push(c as u8);
            } else {
                counters.u64(c);
            }
        }
        bitmap_offsets.push(bitmap.len() as u64);
        bitmap.extend_from_slice(&f.bitmap);
    }
    let num_counters = counters.buf.len() as u64 / width;
    let data_len = rec * s.fns.len() as u64;
    let data_addr: u64 = if s.is_64 {
        0x5555_0000_1000
    } else {
        0x0804_1000
    };
    let counters_addr = if s.counters_before_data {
        data_addr - counters.buf.len() as u64 - 0x40
    } else {
        data_addr + data_len + 0x40
    };
    let bitmap_addr = data_addr + data_len + 0x8000;
    let rel = v >= 8;
    let trunc = |x: u64| if s.is_64 { x } else { u64::from(x as u32) };
    let counters_delta = trunc(if rel {
        counters_addr.wrapping_sub(data_addr)
    } else {
        counters_addr
    });
    let bitmap_delta = trunc(if rel {
        bitmap_addr.wrapping_sub(data_addr)
    } else {
        bitmap_addr
    });

    let mut names_sec = Vec::new();
    let names: Vec<&str> = s
        .names
        .clone()
        .unwrap_or_else(|| s.fns.iter().map(|f| f.name).collect());
    if !names.is_empty() {
        names_sec = names_chunk(&names, s.compress_names);
    }
    let mut vnames_sec = Vec::new();
    if !s.vnames.is_empty() {
        vnames_sec = names_chunk(&s.vnames, false);
    }

    let mut w = W::new(s.endian);
    w.u64(if s.is_64 {
        raw::MAGIC_64
    } else {
        raw::MAGIC_32
    });
    w.u64(u64::from(v) | s.flags);
    let mut ids = W::new(s.endian);
    for id in &s.binary_ids {
        ids.u64(id.len() as u64);
        ids.buf.extend_from_slice(id);
        ids.pad8();
    }
    if v >= 7 {
        w.u64(ids.buf.len() as u64);
    }
    w.u64(s.fns.len() as u64);
    w.u64(0); // padding before counters
    w.u64(num_counters);
    let pad_counters = (8 - counters.buf.len() % 8) % 8;
    w.u64(pad_counters as u64);
    let pad_bitmap = (8 - bitmap.len() % 8) % 8;
    if v >= 9 {
        w.u64(bitmap.len() as u64);
        w.u64(pad_bitmap as u64);
    }
    w.u64(names_sec.len() as u64);
    w.u64(counters_delta);
    if v >= 9 {
        w.u64(bitmap_delta);
    }
    w.u64(0x1234_5000); // names delta
    if v >= 10 {
        w.u64(s.num_vtables);
        w.u64(vnames_sec.len() as u64);
    }
    w.u64(if v >= 10 { 2 } else { 1 }); // value kind last
    w.buf.extend_from_slice(&ids.buf);

    for (i, f) in s.fns.iter().enumerate() {
        let start = w.buf.len();
        w.u64(name_ref(f.name));
        w.u64(f.hash);
        let here = data_addr + i as u64 * rec;
        let cptr = counters_addr + counter_offsets[i];
        let bptr = bitmap_addr + bitmap_offsets[i];
        w.ptr(s.is_64, if rel { cptr.wrapping_sub(here) } else { cptr });
        if v >= 9 {
            w.ptr(
                s.is_64,
                if f.bitmap.is_empty() {
                    0
                } else {
                    bptr.wrapping_sub(here)
                },
            );
        }
        w.ptr(s.is_64, 0xdead_0000 + i as u64); // function pointer
        w.ptr(s.is_64, 0); // values
        let extra = if temporal {
            if byte {
                8
            } else {
                1
            }
        } else {
            0
        };
        w.u32(f.slots.len() as u32 + extra);
        let kinds = if v >= 10 { 3 } else { 2 };
        for k in 0..kinds {
            w.u16(f.sites[k]);
        }
        if v >= 9 {
            while (w.buf.len() - start) % 4 != 0 {
                w.buf.push(0);
            }
            w.u32(f.bitmap.len() as u32);
        }
        while ((w.buf.len() - start) as u64) < rec {
            w.buf.push(0);
        }
    }
    w.buf.extend_from_slice(&counters.buf);
    w.buf.extend(std::iter::repeat_n(0, pad_counters));
    if v >= 9 {
        w.buf.extend_from_slice(&bitmap);
        w.buf.extend(std::iter::repeat_n(0, pad_bitmap));
    }
    w.buf.extend_from_slice(&names_sec);
    w.pad8();
    for i in 0..s.num_vtables {
        let start = w.buf.len();
        w.u64(0x7777 + i);
        w.ptr(s.is_64, 0x9000 + i * 64);
        w.u32(48);
        while (w.buf.len() - start) % 8 != 0 {
            w.buf.push(0);
        }
    }
    w.buf.extend_from_slice(&vnames_sec);
    w.pad8();
    for f in &s.fns {
        if f.sites.iter().any(|&n| n != 0) {
            w.buf.extend_from_slice(&f.values);
        }
    }
    w.buf
}

fn counters_of(p: &RawProfile) -> Vec<(u64, u64, Vec<u64>, Vec<u8>)> {
    p.records
        .iter()
        .map(|r| (r.name_ref, r.hash, r.counters.clone(), r.bitmap.clone()))
        .collect()
}

fn sample_fns() -> Vec<TFn> {
    let mut a = tfn("main", 0x1111, &[1, 0, 5]);
    a.bitmap = vec![0x0f, 0x80, 0x01];
    let b = tfn("foo.c:helper", 0x2222_3333_4444_5555, &[1 << 40]);
    let mut c = tfn("_RNvCs123_4core3bar", 0xffff_ffff_ffff_ffff, &[7, 8]);
    c.bitmap = vec![0xaa];
    vec![a, b, c]
}

fn expected(fns: &[TFn], version: u32) -> Vec<(u64, u64, Vec<u64>, Vec<u8>)> {
    fns.iter()
        .map(|f| {
            let bitmap = if version >= 9 {
                f.bitmap.clone()
            } else {
                vec![]
            };
            (name_ref(f.name), f.hash, f.slots.clone(), bitmap)
        })
        .collect()
}

const ALL_LAYOUTS: [(bool, Endian); 4] = [
    (true, Endian::Little),
    (true, Endian::Big),
    (false, Endian::Little),
    (false, Endian::Big),
];

// ---------------------------------------------------------------------------
// Reading well-formed profiles.

#[test]
fn name_refs_match_llvm() {
    // From llvm/test/tools/llvm-profdata/raw-*.test and a clang profile.
    assert_eq!(name_ref("foo"), 0x5cf8_c24c_db18_bdac);
    assert_eq!(name_ref("bar"), 0xe413_754a_191d_b537);
    assert_eq!(name_ref("main"), 0xdb95_6436_e78d_d5fa);
    assert_eq!(name_ref_bytes(b"main"), name_ref("main"));
}

#[test]
fn every_version_and_layout() {
    for version in raw::SUPPORTED {
        for (is_64, endian) in ALL_LAYOUTS {
            for before in [true, false] {
                let mut s = spec(version, sample_fns());
                s.is_64 = is_64;
                s.endian = endian;
                s.counters_before_data = before;
                if version >= 7 {
                    s.binary_ids = vec![vec![0xab; 20], vec![1, 2, 3, 4, 5, 6, 7, 8]];
                }
                let bytes = write(&s);
                let profiles = read_raw_profiles(&bytes).unwrap_or_else(|e| {
                    panic!("v{version} 64={is_64} {endian:?} before={before}: {e}")
                });
                assert_eq!(profiles.len(), 1);
                let p = &profiles[0];
                assert_eq!(p.version, version);
                assert!(!p.byte_coverage);
                assert_eq!(*p.names, ["main", "foo.c:helper", "_RNvCs123_4core3bar"]);
                assert_eq!(p.binary_ids, s.binary_ids);
                assert_eq!(
                    counters_of(p),
                    expected(&s.fns, version),
                    "v{version} 64={is_64} {endian:?}"
                );
            }
        }
    }
}

#[test]
fn record_sizes() {
    let sizes: Vec<_> = raw::SUPPORTED
        .iter()
        .map(|&v| (raw::record_size(v, true), raw::record_size(v, false)))
        .collect();
    assert_eq!(sizes, [(48, 40), (48, 40), (48, 40), (64, 48), (64, 48)]);
}

#[test]
fn llvm_32_bit_test_vector() {
    // The profile of llvm/test/tools/llvm-profdata/raw-32-bits-le.test
    // (version 10), transcribed.
    let mut w = W::new(Endian::Little);
    w.buf.extend_from_slice(b"\x81Rforpl\xff");
    for v in [
        10u64,
        0,
        2,
        0,
        3,
        0,
        4,
        0,
        16,
        0x0100_0000,
        0x0300_0000,
        0x0200_0000,
        0,
        0,
        0,
    ] {
        w.u64(v);
    }
    w.u64(name_ref("foo"));
    w.u64(1);
    for v in [0x0100_0000u32, 0x0300_0000, 0, 0, 1, 0, 0, 3] {
        w.u32(v);
    }
    w.u64(name_ref("bar"));
    w.u64(2);
    for v in [0x00ff_ffd8u32, 0x02ff_ffd3, 0, 0, 2, 0, 0, 1] {
        w.u32(v);
    }
    for v in [0x13u64, 0x37, 0x41] {
        w.u64(v);
    }
    w.buf.extend_from_slice(&[0x55, 0x55, 0x55, 0x2a]);
    w.buf.extend_from_slice(b"\x07\x00foo\x01bar\0\0\0\0\0\0\0");
    let p = read_raw_profiles(&w.buf).unwrap();
    assert_eq!(
        counters_of(&p[0]),
        [
            (name_ref("foo"), 1, vec![0x13], vec![0x55, 0x55, 0x55]),
            (name_ref("bar"), 2, vec![0x37, 0x41], vec![0x2a])
        ]
    );
    assert_eq!(*p[0].names, ["foo", "bar"]);
}

#[test]
fn byte_coverage_counters() {
    for version in [8, 9, 10] {
        for (is_64, endian) in ALL_LAYOUTS {
            let mut s = spec(
                version,
                vec![tfn("a", 1, &[0, 0xff, 0, 5, 1]), tfn("b", 2, &[0xff])],
            );
            s.flags = BYTE_COVERAGE;
            s.is_64 = is_64;
            s.endian = endian;
            let p = &read_raw_profiles(&write(&s)).unwrap()[0];
            assert!(p.byte_coverage && p.variant.byte_coverage);
            assert_eq!(p.records[0].counters, [1, 0, 1, 0, 0]);
            assert_eq!(p.records[1].counters, [0]);
        }
    }
}

#[test]
fn temporal_timestamp_is_skipped() {
    for flags in [TEMPORAL, TEMPORAL | BYTE_COVERAGE] {
        let mut a = tfn("a", 1, &[0, 3, 0]);
        a.timestamp = 42;
        let mut s = spec(10, vec![a, tfn("b", 2, &[9])]);
        s.flags = flags;
        let p = &read_raw_profiles(&write(&s)).unwrap()[0];
        assert!(p.variant.temporal);
        let want: [&[u64]; 2] = if flags & BYTE_COVERAGE != 0 {
            [&[1, 0, 1], &[0]]
        } else {
            [&[0, 3, 0], &[9]]
        };
        assert_eq!(p.records[0].counters, want[0]);
        assert_eq!(p.records[1].counters, want[1]);
    }
}

#[test]
fn value_data_is_skipped_and_checked() {
    for version in [8, 10] {
        for (is_64, endian) in ALL_LAYOUTS {
            let mut a = tfn("a", 1, &[4]);
            a.sites = [2, 0, 0];
            a.values = value_blob(endian, &[(0, vec![1, 3])]);
            let mut c = tfn("c", 3, &[6]);
            c.sites = [1, 1, 0];
            c.values = value_blob(endian, &[(0, vec![0]), (1, vec![2])]);
            let mut s = spec(version, vec![a, tfn("b", 2, &[5]), c]);
            s.is_64 = is_64;
            s.endian = endian;
            let one = write(&s);
            // A second profile right after the value data proves its size.
            let mut z = spec(version, vec![tfn("z", 9, &[1])]);
            z.is_64 = is_64;
            z.endian = endian;
            let mut two = one.clone();
            two.extend_from_slice(&write(&z));
            let ps = read_raw_profiles(&two).unwrap();
            assert_eq!(ps.len(), 2);
            assert_eq!(
                ps[0]
                    .records
                    .iter()
                    .map(|r| r.counters[0])
                    .collect::<Vec<_>>(),
                [4, 5, 6]
            );
            assert_eq!(*ps[1].names, ["z"]);

            // A value blob that claims more than the file holds.
            let mut bad = one.clone();
            let at = one.len() - a_len(&s);
            let total = match endian {
                Endian::Little => 0xfff0u32.to_le_bytes(),
                Endian::Big => 0xfff0u32.to_be_bytes(),
            };
            bad[at..at + 4].copy_from_slice(&total);
            let err = read_raw_profiles(&bad).unwrap_err().to_string();
            assert!(
                err.contains("value data") && err.contains(&format!("{at:#x}")),
                "{err}"
            );
        }
    }
}

/// Size of all value blobs of a spec.
fn a_len(s: &Spec) -> usize {
    s.fns
        .iter()
        .filter(|f| f.sites.iter().any(|&n| n != 0))
        .map(|f| f.values.len())
        .sum()
}

#[test]
fn concatenated_profiles_and_padding() {
    let a = write(&spec(10, vec![tfn("a", 1, &[1])]));
    let b = write(&spec(10, vec![tfn("b", 2, &[2, 3])]));
    let empty = write(&spec(10, vec![]));
    let mut file = a.clone();
    file.extend_from_slice(&[0; 16]);
    file.extend_from_slice(&empty);
    file.extend_from_slice(&b);
    file.extend_from_slice(&[0; 5]);
    let ps = read_raw_profiles(&file).unwrap();
    assert_eq!(ps.len(), 3);
    assert_eq!(ps[0].records[0].counters, [1]);
    assert!(ps[1].records.is_empty() && ps[1].names.is_empty());
    assert_eq!(ps[2].records[0].counters, [2, 3]);

    // Garbage after a profile.
    let mut bad = a.clone();
    bad.extend_from_slice(&[0, 0, 0, 7]);
    assert!(read_raw_profiles(&bad)
        .unwrap_err()
        .to_string()
        .contains("padding"));
    // A profile of another pointer width after the first.
    let mut other = spec(10, vec![tfn("b", 2, &[2])]);
    other.is_64 = false;
    let mut bad = a.clone();
    bad.extend_from_slice(&write(&other));
    assert!(read_raw_profiles(&bad)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    // An empty file has no profiles (llvm-profdata skips it).
    assert!(read_raw_profiles(&[]).unwrap().is_empty());
}

#[test]
fn compressed_names_vtables_and_extra_names() {
    let mut s = spec(10, sample_fns());
    s.compress_names = true;
    s.names = Some(vec![
        "main",
        "foo.c:helper",
        "unused",
        "_RNvCs123_4core3bar",
    ]);
    s.num_vtables = 3;
    s.vnames = vec!["_ZTV1A", "_ZTV1B"];
    for is_64 in [true, false] {
        s.is_64 = is_64;
        let p = &read_raw_profiles(&write(&s)).unwrap()[0];
        assert_eq!(
            *p.names,
            ["main", "foo.c:helper", "unused", "_RNvCs123_4core3bar"]
        );
        assert_eq!(counters_of(p), expected(&s.fns, 10));
    }
}

#[test]
fn decode_names_chunks_and_padding() {
    let mut bytes = names_chunk(&["a", "bb"], false);
    bytes.extend_from_slice(&[0, 0, 0]);
    bytes.extend_from_slice(&names_chunk(&["c:d", "e"], true));
    bytes.push(0);
    assert_eq!(decode_names(&bytes).unwrap(), ["a", "bb", "c:d", "e"]);
    assert!(decode_names(&[]).unwrap().is_empty());

    let err = |b: &[u8]| decode_names(b).unwrap_err().to_string();
    assert!(err(b"\x03\x00a\x01\x01").contains("empty function name"));
    assert!(err(b"\x00\x00").contains("empty function name"));
    assert!(err(b"\x05\x00abc").contains("exceeds"));
    assert!(err(b"\x02\x00\xff\xfe").contains("UTF-8"));
    assert!(err(b"\x05\x03\x78\x9c\x00").contains("decompress"));
    // A compressed chunk that inflates to more than it declares.
    let mut long = names_chunk(&["abcdef"], true);
    long[0] = 3;
    assert!(err(&long).contains("more than the declared"));
    // One that inflates to less is accepted, as zlib's uncompress does.
    let mut short = names_chunk(&["abc"], true);
    short[0] = 9;
    assert_eq!(decode_names(&short).unwrap(), ["abc"]);
    // Truncated zlib stream.
    let mut cut = names_chunk(&["abcdefghijklmnop"], true);
    let n = cut.len();
    cut[1] -= 4;
    cut.truncate(n - 4);
    assert!(err(&cut).contains("decompress"), "{}", err(&cut));
}

#[test]
fn name_tables_find_names_by_reference_and_know_their_section() {
    let mut section = names_chunk(&["main", "foo.c:helper"], false);
    section.extend_from_slice(&names_chunk(&["_RNvCs123_4core3bar"], true));
    let table = NameTable::decode(&section).unwrap();
    assert_eq!(**table.names(), ["main", "foo.c:helper", "_RNvCs123_4core3bar"]);
    assert_eq!(table.get(name_ref("foo.c:helper")), Some("foo.c:helper"));
    assert_eq!(table.index_of(name_ref("_RNvCs123_4core3bar")), Some(2));
    assert_eq!(table.get(name_ref("other")), None);
    assert!(table.is_section(&section));
    assert!(!table.is_section(&section[..section.len() - 1]));
    // A table of names decoded elsewhere is no section's.
    let listed = NameTable::from_names(table.names().clone());
    assert_eq!(listed.get(name_ref("main")), Some("main"));
    assert!(!listed.is_section(&section) && !listed.is_section(&[]));
    assert!(NameTable::decode(b"\x00\x00").unwrap_err().to_string().contains("empty function name"));

    // A reader hands out the table of each profile's names, the same one
    // for profiles of the same names section.
    let mut reader = ProfileReader::new();
    let mut tables = Vec::new();
    let profile = write(&spec(10, sample_fns()));
    let twice = [profile.clone(), profile].concat();
    reader.read_into(&twice, &mut Counters::new(), |t| tables.push(t.clone())).unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(**tables[0].names(), ["main", "foo.c:helper", "_RNvCs123_4core3bar"]);
    assert!(Arc::ptr_eq(&tables[0], &tables[1]));
}

#[test]
fn a_table_of_references_merges_as_the_whole_table() {
    let section = names_chunk(&["main", "foo.c:helper"], true);
    let whole = Arc::new(NameTable::decode(&section).unwrap());
    let refs = Arc::new(whole.references_only());
    assert!(whole.has_names() && !refs.has_names());
    assert!(refs.names().is_empty() && !refs.is_section(&section));
    assert!(refs.index_of(name_ref("foo.c:helper")).is_some() && refs.index_of(name_ref("main")).is_some());
    assert_eq!(refs.index_of(name_ref("other")), None);
    assert_eq!(refs.get(name_ref("foo.c:helper")), None);

    let record = |name: &str, hash, counters: &[u64]| FunctionCounters {
        name_ref: name_ref(name),
        hash,
        counters: counters.to_vec(),
        bitmap: vec![],
    };
    let records = || vec![record("main", 1, &[1, 2]), record("foo.c:helper", 2, &[3]), record("other", 3, &[4])];
    let (mut with_names, mut with_refs) = (Counters::new(), Counters::new());
    for _ in 0..2 {
        with_names.add_module(Variant::default(), whole.clone(), records()).unwrap();
        with_refs.add_module(Variant::default(), refs.clone(), records()).unwrap();
    }
    for (name, hash) in [("main", 1), ("foo.c:helper", 2)] {
        assert_eq!(found(&with_refs, name, hash), found(&with_names, name, hash));
    }
    assert_eq!(found(&with_refs, "main", 1).0, [2, 4]);
    // A reference that is not the section's is unnamed with either table.
    assert_eq!(with_refs.warnings(), with_names.warnings());
    assert!(with_refs.warnings().iter().any(|w| w.contains("not found among the profile's names")), "{:?}", with_refs.warnings());

    // A warning names the function by its reference when the table has no names.
    let (mut a, mut b) = (Counters::new(), Counters::new());
    for (counters, table) in [(&mut a, &whole), (&mut b, &refs)] {
        counters.add_module(Variant::default(), table.clone(), vec![record("main", 1, &[1, 2])]).unwrap();
        counters.add_module(Variant::default(), table.clone(), vec![record("main", 1, &[1])]).unwrap();
    }
    assert!(a.warnings().iter().any(|w| w.starts_with("function main (hash")), "{:?}", a.warnings());
    let by_ref = format!("function with NameRef {:#018x} (hash", name_ref("main"));
    assert!(b.warnings().iter().any(|w| w.starts_with(&by_ref)), "{:?}", b.warnings());
}

#[test]
fn record_seam_for_live_memory() {
    // Sections as a loaded module holds them: version 10, counters right
    // before the data records, read with the module's addresses.
    let s = spec(10, sample_fns());
    let file = write(&s);
    let p = &read_raw_profiles(&file).unwrap()[0];
    let rec = raw::record_size(10, true);
    let data_start = 128;
    let data = &file[data_start..data_start + 3 * rec];
    let counters_start = data_start + 3 * rec;
    let counters = &file[counters_start..counters_start + 6 * 8];
    let bitmap = &file[counters_start + 6 * 8..counters_start + 6 * 8 + 4];
    let data_addr = 0x5555_0000_1000u64;
    let layout = RecordLayout::for_module(
        10,
        true,
        Endian::Little,
        data_addr,
        data_addr - 48 - 0x40,
        data_addr + 3 * rec as u64 + 0x8000,
    )
    .unwrap();
    assert_eq!(layout.record_size(), 64);
    assert_eq!(
        decode_records(&layout, data, counters, bitmap).unwrap(),
        p.records
    );
    // Errors there are relative to the slices.
    let err = decode_records(&layout, data, &counters[..16], bitmap).unwrap_err();
    // Record 0 (3 counters) no longer fits: reported at its NumCounters.
    assert!(matches!(err, Error::Malformed { offset: 48, .. }), "{err}");
    assert!(decode_records(&layout, &data[..10], counters, bitmap).is_err());

    // Version 7 (absolute counter addresses), 32-bit big-endian.
    let mut s = spec(7, sample_fns());
    s.is_64 = false;
    s.endian = Endian::Big;
    let file = write(&s);
    let p = &read_raw_profiles(&file).unwrap()[0];
    let (data, counters) = file[88..].split_at(3 * 40);
    let data_addr = 0x0804_1000u64;
    let layout =
        RecordLayout::for_module(7, false, Endian::Big, data_addr, data_addr - 48 - 0x40, 0)
            .unwrap();
    assert_eq!(layout.counters_delta, data_addr - 48 - 0x40);
    assert_eq!(
        decode_records(&layout, data, &counters[..48], &[]).unwrap(),
        p.records
    );
}

#[test]
fn variant_flags() {
    let v =
        Variant::from_version_word(10 | IR | BYTE_COVERAGE | TEMPORAL | CONTEXT_SENSITIVE).unwrap();
    assert!(v.ir && v.byte_coverage && v.temporal && v.context_sensitive && !v.function_entry_only);
    let e = Variant::from_version_word(10 | (1 << 40))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown raw profile variant flags 0x10000000000"),
        "{e}"
    );
    assert!(Variant::from_version_word(10 | DEBUG_INFO_CORRELATE)
        .unwrap_err()
        .to_string()
        .contains("correlat"));
    assert!(Variant::from_version_word(10 | (1 << 62)).is_err());
}

#[test]
fn real_profiles_match_llvm_profdata() {
    use super::real_profiles::*;
    for real in ALL {
        let bytes = hex_bytes(real.bytes);
        let profiles = read_raw_profiles(&bytes).unwrap();
        assert_eq!(profiles.len(), real.profiles);
        let mut distinct = HashSet::new();
        let mut c = Counters::new();
        for p in profiles {
            // Linked with a GNU build id.
            assert_eq!(p.binary_ids.iter().map(Vec::len).collect::<Vec<_>>(), [20]);
            distinct.extend(p.records.iter().map(|r| (r.name_ref, r.hash)));
            c.add(p).unwrap();
        }
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        assert_eq!(distinct.len(), real.records.len());
        for (name, hash, counts, bitmap) in real.records {
            assert_eq!(found(&c, name, *hash), (*counts, *bitmap), "{name}");
        }
        assert_eq!(
            c.byte_coverage(),
            std::ptr::eq(real, &CLANG19_BYTE_COVERAGE_V10)
        );
        let mut merged = Counters::new();
        ProfileReader::new().read_into(&bytes, &mut merged, |_| {}).unwrap();
        for (name, hash, counts, bitmap) in real.records {
            assert_eq!(found(&merged, name, *hash), (*counts, *bitmap), "{name} (read_into)");
        }
        // Every cut either fails or ends between two profiles.
        for len in 1..bytes.len() {
            if let Ok(ps) = read_raw_profiles(&bytes[..len]) {
                assert!(ps.len() < real.profiles, "cut at {len}");
            }
        }
    }
    let temporal = read_raw_profiles(&hex_bytes(CLANG19_IR_TEMPORAL_V10.bytes)).unwrap();
    assert!(temporal[0].variant.temporal && temporal[0].variant.ir);
    assert!(!temporal[1].variant.temporal && temporal[1].variant.ir);
    let v8 = read_raw_profiles(&hex_bytes(CLANG14_VALUES_V8.bytes)).unwrap();
    assert_eq!(v8[0].version, 8);
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------
// Malformed input.

fn assert_malformed(bytes: &[u8], what: &str, offset: u64) {
    match read_raw_profiles(bytes) {
        Err(Error::Malformed {
            what: w,
            offset: o,
            detail,
        }) => {
            assert!(
                w.contains(what) && o == offset,
                "got {w} at {o:#x}: {detail}; want {what} at {offset:#x}"
            )
        }
        other => panic!("want malformed {what} at {offset:#x}, got {other:?}"),
    }
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn not_a_profile() {
    assert_malformed(b"hello world, not a profile", "raw profile header", 0);
    assert!(read_raw_profiles(b"main\n# Func Hash:\n")
        .unwrap_err()
        .to_string()
        .contains("text"));
    assert!(read_raw_profiles(b"\x7fELF\x02\x01\x01\0\0\0")
        .unwrap_err()
        .to_string()
        .contains("bad magic"));
    assert_malformed(b"\x81", "raw profile header", 0);
    let e = read_raw_profiles(b"\xfflprofi\x81\x0c\0\0\0\0\0\0\0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("indexed profile"), "{e}");
}

#[test]
fn unsupported_versions_are_named() {
    for version in [4u64, 6, 11, 0x1_0000_0008] {
        let mut b = write(&spec(10, sample_fns()));
        put_u64(&mut b, 8, version);
        let e = read_raw_profiles(&b).unwrap_err();
        let text = e.to_string();
        if version == 0x1_0000_0008 {
            assert!(text.contains("variant flags"), "{text}");
        } else {
            assert!(matches!(e, Error::Unsupported(_)), "{text}");
            assert!(
                text.contains(&format!("version {version} is not supported")),
                "{text}"
            );
            assert!(
                text.contains("LLVM 19-22") && text.contains("LLVM 14-17"),
                "{text}"
            );
        }
    }
}

#[test]
fn bad_record_fields() {
    let good = write(&spec(8, sample_fns()));
    let rec0 = 88usize;
    // Counter pointer before the counters section.
    let mut b = good.clone();
    put_u64(&mut b, rec0 + 16, 0xffff_ffff_ffff_0000);
    assert_malformed(&b, "data record", rec0 as u64 + 16);
    // Counter pointer past the counters section.
    let mut b = good.clone();
    let ptr = u64::from_le_bytes(b[rec0 + 16..rec0 + 24].try_into().unwrap());
    put_u64(&mut b, rec0 + 16, ptr + 6 * 8);
    assert_malformed(&b, "data record", rec0 as u64 + 16);
    // NumCounters beyond the remaining space, and zero.
    let mut b = good.clone();
    put_u32(&mut b, rec0 + 40, 7);
    assert_malformed(&b, "data record", rec0 as u64 + 40);
    let mut b = good.clone();
    put_u32(&mut b, rec0 + 40, 0);
    assert_malformed(&b, "data record", rec0 as u64 + 40);
    // A counter above 2^56.
    let mut b = good.clone();
    put_u64(&mut b, rec0 + 3 * 48, (1 << 56) + 1);
    assert_malformed(&b, "counters", rec0 as u64 + 3 * 48);
    let mut b = good.clone();
    put_u64(&mut b, rec0 + 3 * 48, 1 << 56);
    assert!(read_raw_profiles(&b).is_ok());
}

#[test]
fn bad_header_sizes() {
    let good = write(&spec(10, sample_fns()));
    // NumData, NumCounters, NamesSize, binary ids size, vtables, paddings:
    // huge, overflowing or merely too large values.
    for (field, value) in [
        (3, u64::MAX),
        (3, u64::MAX / 64 + 1),
        (3, 4),
        (5, u64::MAX / 8 + 1),
        (5, 1000),
        (9, 10_000),
        (2, 8),
        (2, 12),
        (13, 1 << 60),
        (14, 3),
        (4, u64::MAX),
        (6, 1 << 62),
        (8, u64::MAX - 3),
    ] {
        let mut b = good.clone();
        put_u64(&mut b, field * 8, value);
        let r = read_raw_profiles(&b);
        assert!(
            matches!(r, Err(Error::Malformed { .. })),
            "field {field} = {value:#x}: {r:?}"
        );
    }
    // Binary id of length 0, and one longer than the section.
    let mut s = spec(10, sample_fns());
    s.binary_ids = vec![vec![9; 4]];
    let good = write(&s);
    let mut b = good.clone();
    put_u64(&mut b, 128, 0);
    assert_malformed(&b, "binary id", 128);
    let mut b = good.clone();
    put_u64(&mut b, 128, 9);
    assert_malformed(&b, "binary id", 128);
}

#[test]
fn every_truncation_fails_cleanly() {
    let mut specs = vec![];
    for version in raw::SUPPORTED {
        for (is_64, endian) in ALL_LAYOUTS {
            let mut s = spec(version, sample_fns());
            s.is_64 = is_64;
            s.endian = endian;
            if version >= 7 {
                s.binary_ids = vec![vec![0xab; 20]];
            }
            if version == 10 {
                s.num_vtables = 1;
                s.vnames = vec!["_ZTV1A"];
                s.compress_names = true;
                s.fns[1].sites = [1, 0, 0];
                s.fns[1].values = value_blob(endian, &[(0, vec![2])]);
            }
            specs.push(s);
        }
    }
    for s in specs {
        let bytes = write(&s);
        assert!(read_raw_profiles(&bytes).is_ok());
        for len in 1..bytes.len() {
            match read_raw_profiles(&bytes[..len]) {
                Err(Error::Malformed { offset, .. }) => assert!(offset <= len as u64),
                other => panic!(
                    "v{} truncated to {len} of {}: {other:?}",
                    s.version,
                    bytes.len()
                ),
            }
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    // Deterministic pseudo-random single and multi-byte corruption.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut s = spec(10, sample_fns());
    s.binary_ids = vec![vec![1; 20]];
    s.fns[0].sites = [1, 1, 0];
    s.fns[0].values = value_blob(Endian::Little, &[(0, vec![1]), (1, vec![0])]);
    s.compress_names = true;
    let good = write(&s);
    for _ in 0..20_000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            b[at] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                _ => next() as u8,
            };
        }
        let _ = read_raw_profiles(&b);
    }
}

// ---------------------------------------------------------------------------
// Merging and lookup.

fn profile(records: &[(&str, u64, &[u64], &[u8])]) -> RawProfile {
    let mut names: Vec<String> = vec![];
    for (n, ..) in records {
        if !names.iter().any(|x| x == n) && !n.is_empty() {
            names.push(n.to_string());
        }
    }
    RawProfile {
        version: 10,
        variant: Variant::default(),
        byte_coverage: false,
        binary_ids: vec![],
        records: records
            .iter()
            .map(|(n, h, c, b)| FunctionCounters {
                name_ref: if n.is_empty() { 0x1234 } else { name_ref(n) },
                hash: *h,
                counters: c.to_vec(),
                bitmap: b.to_vec(),
            })
            .collect(),
        names: Arc::new(names.iter().map(String::as_str).collect()),
    }
}

fn found<'a>(c: &'a Counters, name: &str, hash: u64) -> (&'a [u64], &'a [u8]) {
    match c.lookup(name_ref(name), hash) {
        Lookup::Found { counters, bitmap } => (counters, bitmap),
        other => panic!("{name}/{hash}: {other:?}"),
    }
}

#[test]
fn merge_sums_and_ors() {
    let mut c = Counters::new();
    c.add(profile(&[("f", 1, &[1, 2], &[0b01]), ("g", 7, &[0], &[])]))
        .unwrap();
    c.add(profile(&[
        ("f", 1, &[10, 20], &[0b10]),
        ("f", 2, &[5], &[]),
    ]))
    .unwrap();
    assert_eq!(found(&c, "f", 1), (&[11u64, 22][..], &[0b11u8][..]));
    assert_eq!(found(&c, "f", 2).0, [5]);
    assert_eq!(found(&c, "g", 7).0, [0]);
    assert!(c.warnings().is_empty());
    assert_eq!(c.profiles(), 2);
}

#[test]
fn sparse_lookups_leave_out_the_names_that_counted_nothing() {
    let mut c = Counters::new();
    c.add(profile(&[
        ("zero", 1, &[0, 0], &[0]),
        // A name is written whole when one of its records counted.
        ("some", 1, &[0], &[]),
        ("some", 2, &[3], &[]),
        ("bits", 1, &[0], &[0b1]),
    ]))
    .unwrap();
    assert_eq!(c.lookup(name_ref("zero"), 5), Lookup::HashMismatch);
    c.set_sparse(true);
    assert_eq!(c.lookup(name_ref("zero"), 1), Lookup::Unknown);
    assert_eq!(c.lookup(name_ref("zero"), 5), Lookup::Unknown);
    assert_eq!(found(&c, "some", 1).0, [0]);
    assert_eq!(c.lookup(name_ref("some"), 5), Lookup::HashMismatch);
    assert_eq!(found(&c, "bits", 1).1, [0b1]);
    // Kept across a new merge of the same modules.
    c.clear();
    c.add(profile(&[("zero", 1, &[0], &[])])).unwrap();
    assert_eq!(c.lookup(name_ref("zero"), 1), Lookup::Unknown);
    c.set_sparse(false);
    assert_eq!(found(&c, "zero", 1).0, [0]);
}

#[test]
fn merge_count_mismatch_keeps_first() {
    let mut c = Counters::new();
    c.add(profile(&[("f", 1, &[1, 2], &[])])).unwrap();
    c.add(profile(&[("f", 1, &[1, 2, 3], &[])])).unwrap();
    assert_eq!(found(&c, "f", 1).0, [1, 2]);
    assert_eq!(c.warnings().len(), 1);
    assert!(c.warnings()[0].contains("count_mismatch") && c.warnings()[0].contains("function f "));
}

#[test]
fn merge_bitmap_mismatch_sums_counters() {
    let mut c = Counters::new();
    c.add(profile(&[("f", 1, &[1], &[1])])).unwrap();
    c.add(profile(&[("f", 1, &[2], &[2, 2])])).unwrap();
    assert_eq!(found(&c, "f", 1), (&[3u64][..], &[1u8][..]));
    assert!(c.warnings()[0].contains("bitmap_mismatch"));
}

#[test]
fn merge_saturates_and_pseudo_counts() {
    let mut c = Counters::new();
    c.add(profile(&[
        ("f", 1, &[1 << 56, u64::MAX - 5], &[]),
        ("p", 2, &[u64::MAX, 4], &[]),
    ]))
    .unwrap();
    c.add(profile(&[
        ("f", 1, &[1 << 56, 10], &[]),
        ("p", 2, &[u64::MAX - 1, 4], &[]),
    ]))
    .unwrap();
    assert_eq!(found(&c, "f", 1).0, [1 << 57, u64::MAX - 2]);
    assert_eq!(found(&c, "p", 2).0, [u64::MAX, 4]);
    assert_eq!(c.warnings().len(), 1);
    assert!(c.warnings()[0].contains("counter_overflow"));
    c.add(profile(&[("p", 2, &[3, 4], &[])])).unwrap();
    assert_eq!(found(&c, "p", 2).0, [u64::MAX, 4]);
    assert!(c.warnings()[1].contains("count_mismatch"));
}

#[test]
fn lookup_hash_mismatch_and_unknown() {
    let cs = 1u64 << 60;
    let mut c = Counters::new();
    c.add(profile(&[("f", 5, &[1], &[])])).unwrap();
    assert_eq!(c.lookup(name_ref("f"), 6), Lookup::HashMismatch);
    // A hash with the other context-sensitivity bit is not a mismatch.
    assert_eq!(c.lookup(name_ref("f"), 6 | cs), Lookup::Unknown);
    assert_eq!(c.lookup(name_ref("g"), 5), Lookup::Unknown);
}

#[test]
fn unresolved_names_are_the_fallback() {
    let mut c = Counters::new();
    // Record "" gets NameRef 0x1234, which is not among the names.
    c.add(profile(&[("f", 5, &[1], &[]), ("", 9, &[4, 4], &[])]))
        .unwrap();
    assert!(c.warnings()[0].contains("NameRef"));
    assert_eq!(found(&c, "f", 5).0, [1]);
    assert_eq!(c.lookup(name_ref("f"), 9), Lookup::HashMismatch);
    assert_eq!(found(&c, "anything", 9).0, [4, 4]);
    assert_eq!(c.lookup(name_ref("anything"), 5), Lookup::HashMismatch);
}

#[test]
fn profile_kinds() {
    let with = |flags: u64| {
        let mut p = profile(&[("f", 1, &[1], &[])]);
        p.variant = Variant::from_version_word(10 | flags).unwrap();
        p.byte_coverage = p.variant.byte_coverage;
        p
    };
    let mut c = Counters::new();
    assert!(!c.byte_coverage());
    c.add(with(0)).unwrap();
    c.add(with(BYTE_COVERAGE)).unwrap();
    assert!(c.byte_coverage());
    assert_eq!(found(&c, "f", 1).0, [2]);
    assert!(c.warnings()[0].contains("byte-coverage"));

    let mut c = Counters::new();
    c.add(with(FUNCTION_ENTRY_ONLY)).unwrap();
    assert!(matches!(
        c.add(with(INSTR_ENTRY | IR)),
        Err(Error::Mismatch(_))
    ));
    assert_eq!(c.profiles(), 1);
    assert_eq!(found(&c, "f", 1).0, [1]);
}

#[test]
fn read_into_merges_as_read_and_add() {
    // A count mismatch, a bitmap mismatch and an unresolved name, over
    // three files, one of them two concatenated profiles.
    let mut first = spec(10, sample_fns());
    first.binary_ids = vec![vec![0xab; 20]];
    let mut fns = sample_fns();
    fns[0].slots.push(9);
    fns[1].bitmap.push(0x01);
    let mut second = spec(10, fns);
    second.names = Some(vec!["main", "foo.c:helper"]);
    let files = [write(&first), write(&second), [write(&first), write(&first)].concat()];

    let mut added = Counters::new();
    let mut reader = ProfileReader::new();
    let mut ids_added = Vec::new();
    for file in &files {
        for p in reader.read(file).unwrap() {
            ids_added.push(p.binary_ids.clone());
            added.add(p).unwrap();
        }
    }
    let mut merged = Counters::new();
    let mut reader = ProfileReader::new();
    let mut ids_merged = Vec::new();
    for file in &files {
        ids_merged.extend(reader.read_into(file, &mut merged, |_| {}).unwrap());
    }

    assert_eq!(ids_merged, ids_added);
    assert_eq!(merged.profiles(), 4);
    assert_eq!(merged.warnings(), added.warnings());
    assert_eq!(merged.warnings().len(), 3, "{:?}", merged.warnings());
    for f in sample_fns() {
        assert_eq!(merged.lookup(name_ref(f.name), f.hash), added.lookup(name_ref(f.name), f.hash), "{}", f.name);
    }
    assert_eq!(found(&merged, "main", 0x1111), (&[3, 0, 15][..], &[0x0f, 0x80, 0x01][..]));
}
