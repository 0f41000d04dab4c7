//! Reading LCOV reports in the end-to-end tests: counts per file, line and function.

use std::collections::BTreeMap;

/// Per file: DA counts by line and FNDA counts by function.
#[derive(Debug, Default, PartialEq)]
pub struct FileCoverage {
    pub lines: BTreeMap<u32, u64>,
    pub functions: BTreeMap<String, u64>,
}

/// The counts of every `SF:` file (the records of one file added up).
pub fn parse_lcov(lcov: &str) -> BTreeMap<String, FileCoverage> {
    let mut files = BTreeMap::new();
    let mut current = String::new();
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            current = f.to_owned();
            files.entry(current.clone()).or_insert_with(FileCoverage::default);
        } else if let Some(da) = line.strip_prefix("DA:") {
            let (l, c) = da.split_once(',').expect("DA:line,count");
            files.get_mut(&current).expect("SF first").lines.insert(l.parse().expect("line"), c.parse().expect("count"));
        } else if let Some(fnda) = line.strip_prefix("FNDA:") {
            let (c, name) = fnda.split_once(',').expect("FNDA:count,name");
            *files.get_mut(&current).expect("SF first").functions.entry(name.to_owned()).or_default() +=
                c.parse::<u64>().expect("count");
        }
    }
    files
}

/// The file whose name ends with `suffix`; panics when there is none.
pub fn file_ending<'a>(files: &'a BTreeMap<String, FileCoverage>, suffix: &str) -> &'a FileCoverage {
    files
        .iter()
        .find(|(name, _)| name.ends_with(suffix))
        .map(|(_, f)| f)
        .unwrap_or_else(|| panic!("no SF: record ending with {suffix} in {:?}", files.keys().collect::<Vec<_>>()))
}

/// Lines with a count > 0, per `SF:` file (every file, even one without any).
pub fn lines_hit(lcov: &str) -> BTreeMap<String, Vec<u32>> {
    let mut files: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut file = String::new();
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            file = f.to_owned();
            files.entry(file.clone()).or_default();
        } else if let Some(da) = line.strip_prefix("DA:") {
            let (l, c) = da.split_once(',').expect("DA:line,count");
            if c != "0" {
                files.get_mut(&file).expect("SF first").push(l.parse().expect("line"));
            }
        }
    }
    files
}
