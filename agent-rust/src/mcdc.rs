//! MC/DC records: which test vectors of each decision ran, and which
//! conditions were shown to act on the decision's outcome on their own,
//! as llvm-cov (LLVM 22) computes them for `-fcoverage-mcdc` builds
//! (clang 19 and later).
//!
//! A decision region gives the number of its conditions and where its bits
//! end in the function's bitmap; each condition is an MC/DC branch region
//! with an id (0 first) and the id of the condition evaluated next when it
//! is false and when it is true (none: the decision is made). The
//! conditions form a graph; every path from condition 0 to an outcome is a
//! test vector with its own bit, set by the program when that path ran.
//! The bit of a path is what llvm-cov's `TVIdxBuilder` assigns: the
//! outcomes of the graph are numbered by decreasing width (the number of
//! paths that reach the condition deciding them), ties in breadth-first
//! order, each taking as many numbers as its width; a path's number is
//! the sum of the numbers on its edges, an edge into a condition carrying
//! the condition's width as the walk reached it.
//!
//! A condition is covered ("independence pair") when two executed vectors
//! of opposite outcomes differ in that condition alone (conditions not
//! evaluated in one of them do not count). Constant-folded conditions
//! (one side's counter is the constant zero) are still shown but are not
//! counted in summaries.
//!
//! Malformed parameters (a condition id out of range or given twice, a
//! next id that points back at the first condition or forms a cycle, a
//! bitmap index that the decision's vectors do not fit below or that lies
//! beyond the bitmap) make the decision's record be left out, never a
//! panic: llvm-cov has no defined behaviour there (assertions or reads out
//! of bounds).

use crate::mapping::{Counter, FunctionMapping, McdcKind, Region, RegionKind};

/// One decision's MC/DC record, as llvm-cov's `MCDCRecord`. Conditions are
/// given by position: the condition with id 0 first, then the others in
/// mapping order.
#[derive(Debug, Clone)]
pub struct McdcRecord<'m> {
    pub decision: &'m Region,
    /// Per condition: whether a counter of its branch is the constant zero.
    pub folded: Vec<bool>,
    /// Per condition: whether an independence pair covers it.
    pub covered: Vec<bool>,
    /// The executed test vectors: those that decided false, then those
    /// that decided true, each in the order of a walk of the conditions
    /// that tries false before true.
    pub vectors: Vec<TestVector>,
}

/// One executed test vector: each condition's value (`None`: not
/// evaluated) and the decision's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestVector {
    pub conditions: Vec<Option<bool>>,
    pub result: bool,
}

impl McdcRecord<'_> {
    /// The number of executed vectors that decided true, and false.
    pub fn decisions(&self) -> (u64, u64) {
        let true_ = self.vectors.iter().filter(|v| v.result).count() as u64;
        (true_, self.vectors.len() as u64 - true_)
    }

    /// Conditions not folded, and of them those covered: what summaries
    /// count.
    pub fn pairs(&self) -> (u64, u64) {
        let mut count = 0;
        let mut covered = 0;
        for (&folded, &c) in self.folded.iter().zip(&self.covered) {
            if !folded {
                count += 1;
                covered += u64::from(c);
            }
        }
        (count, covered)
    }
}

/// A decision whose conditions are being collected, in mapping order.
struct Pending<'m> {
    region: &'m Region,
    bitmap_index: u32,
    num_conditions: usize,
    /// (region, id, next ids) of its conditions, id 0 first.
    branches: Vec<(&'m Region, i16, [i16; 2])>,
    seen: Vec<bool>,
    /// File ids of the expansions inside the decision (and nested in them).
    expanded: Vec<u32>,
}

impl Pending<'_> {
    fn dominates(&self, r: &Region) -> bool {
        (r.file_id == self.region.file_id && r.start() >= self.region.start() && r.end() <= self.region.end())
            || self.expanded.contains(&r.file_id)
    }
}

/// The MC/DC records of function `f`, in the order its decisions get their
/// last condition, from its bitmap (empty when the profile has none: no
/// vector ran).
pub fn records<'m>(f: &'m FunctionMapping, bitmap: &[u8]) -> Vec<McdcRecord<'m>> {
    let mut out = Vec::new();
    if f.mcdc().is_empty() {
        return out;
    }
    let mut pending: Vec<Pending<'m>> = Vec::new();
    let mut params = f.mcdc().iter().peekable();
    for (index, region) in f.regions().iter().enumerate() {
        let kind = match params.peek() {
            Some(p) if p.region as usize == index => params.next().map(|p| p.kind),
            _ => None,
        };
        match (region.kind, kind) {
            (RegionKind::McdcDecision, Some(McdcKind::Decision { bitmap_index, num_conditions })) => {
                pending.push(Pending {
                    region,
                    bitmap_index,
                    num_conditions: num_conditions as usize,
                    branches: Vec::new(),
                    seen: vec![false; num_conditions as usize],
                    expanded: Vec::new(),
                });
            }
            (RegionKind::Expansion, _) => {
                // The first decision it is in records it.
                if let Some(d) = pending.iter_mut().find(|d| d.dominates(region)) {
                    d.expanded.push(region.expanded_file_id);
                }
            }
            (RegionKind::McdcBranch, Some(McdcKind::Branch { id, next })) => {
                // The first decision that lacks the id and contains the
                // condition takes it; a condition no decision takes is
                // dropped.
                let taker = pending.iter().position(|d| {
                    let slot = usize::try_from(id).ok().filter(|&i| i < d.num_conditions);
                    slot.is_some_and(|i| !d.seen[i]) && d.dominates(region)
                });
                let Some(at) = taker else { continue };
                let d = &mut pending[at];
                d.seen[id as usize] = true;
                if id == 0 {
                    d.branches.insert(0, (region, id, next));
                } else {
                    d.branches.push((region, id, next));
                }
                if d.branches.len() == d.num_conditions {
                    let d = pending.remove(at);
                    if let Some(record) = evaluate(&d, bitmap) {
                        out.push(record);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A set of condition ids, a bit each.
#[derive(Clone, PartialEq, Eq)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize, on: bool) {
        let (w, b) = (i / 64, i % 64);
        if on {
            self.0[w] |= 1 << b;
        } else {
            self.0[w] &= !(1 << b);
        }
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 != 0
    }
}

/// A test vector by condition id: which were evaluated, and to what.
#[derive(Clone)]
struct Vector {
    visited: Bits,
    values: Bits,
}

/// The only condition in which `a` and `b` differ, both evaluated.
fn only_difference(a: &Vector, b: &Vector) -> Option<usize> {
    let mut found = None;
    for (w, (((av, ai), bv), bi)) in a.values.0.iter().zip(&a.visited.0).zip(&b.values.0).zip(&b.visited.0).enumerate() {
        let diff = (av ^ bv) & ai & bi;
        if diff == 0 {
            continue;
        }
        if found.is_some() || diff.count_ones() > 1 {
            return None;
        }
        found = Some(w * 64 + diff.trailing_zeros() as usize);
    }
    found
}

/// The bit numbers of a decision's outcomes (see the module's comment):
/// per condition id, what its false and true edges add to a path's number,
/// and the number of paths. `None` when the graph is malformed.
fn test_vector_indices(next: &[[i16; 2]]) -> Option<(Vec<[i64; 2]>, i64)> {
    let n = next.len();
    let mut in_count = vec![0u32; n];
    for ids in next {
        for &id in ids {
            match id {
                -1 => {}
                // Back to the first condition, or beyond the last.
                0 => return None,
                id if id < 0 || id as usize >= n => return None,
                id => in_count[id as usize] += 1,
            }
        }
    }
    if in_count.first() != Some(&0) {
        return None;
    }
    let mut width = vec![0i64; n];
    let mut indices = vec![[0i64; 2]; n];
    // (-width, order, id, side) of each edge to an outcome.
    let mut outcomes: Vec<(i64, usize, usize, usize)> = Vec::new();
    let mut queue = std::collections::VecDeque::from([0usize]);
    width[0] = 1;
    let mut processed = 0;
    while let Some(id) = queue.pop_front() {
        processed += 1;
        for side in 0..2 {
            let to = next[id][side];
            if to < 0 {
                outcomes.push((-width[id], outcomes.len(), id, side));
                continue;
            }
            let to = to as usize;
            indices[id][side] = width[to];
            width[to] += width[id];
            if width[to] > i64::from(i32::MAX) {
                return None;
            }
            in_count[to] -= 1;
            if in_count[to] == 0 {
                queue.push_back(to);
            }
        }
    }
    // A cycle, or conditions the first does not lead to.
    if processed != n {
        return None;
    }
    outcomes.sort_unstable();
    let mut total = 0i64;
    for (neg_width, _, id, side) in outcomes {
        indices[id][side] = total;
        total -= neg_width;
        if total > i64::from(i32::MAX) {
            return None;
        }
    }
    Some((indices, total))
}

fn evaluate<'m>(d: &Pending<'m>, bitmap: &[u8]) -> Option<McdcRecord<'m>> {
    let n = d.num_conditions;
    let mut next = vec![[-1i16; 2]; n];
    for &(_, id, ids) in &d.branches {
        next[id as usize] = ids;
    }
    let (indices, num_vectors) = test_vector_indices(&next)?;
    // The decision's bits are the `num_vectors` below its bitmap index.
    let first_bit = i64::from(d.bitmap_index) - num_vectors;
    if first_bit < 0 {
        return None;
    }
    let bits = bitmap.len() as i64 * 8;
    if !bitmap.is_empty() && i64::from(d.bitmap_index) > bits {
        return None;
    }
    let executed = |index: i64| {
        let bit = first_bit + index;
        bit < bits && bitmap[(bit / 8) as usize] >> (bit % 8) & 1 != 0
    };

    // Walk every path, false before true; keep those that ran, by outcome.
    let mut by_result: [Vec<(i64, Vector)>; 2] = [Vec::new(), Vec::new()];
    if bitmap.iter().any(|&b| b != 0) {
        let mut tv = Vector { visited: Bits::new(n), values: Bits::new(n) };
        // (condition id, its path number so far, sides tried).
        let mut stack: Vec<(usize, i64, usize)> = vec![(0, 0, 0)];
        while let Some(top) = stack.last_mut() {
            let (id, index, side) = *top;
            if side == 2 {
                tv.visited.set(id, false);
                tv.values.set(id, false);
                stack.pop();
                continue;
            }
            top.2 += 1;
            tv.visited.set(id, true);
            tv.values.set(id, side == 1);
            let index = index + indices[id][side];
            match next[id][side] {
                to if to >= 0 => stack.push((to as usize, index, 0)),
                _ => {
                    if executed(index) {
                        by_result[side].push((index, tv.clone()));
                    }
                }
            }
        }
    }

    for vectors in &mut by_result {
        vectors.sort_unstable_by_key(|&(index, _)| index);
    }
    let mut covered_ids = vec![false; n];
    for (_, a) in &by_result[1] {
        for (_, b) in &by_result[0] {
            if let Some(id) = only_difference(a, b) {
                covered_ids[id] = true;
            }
        }
    }
    let positions: Vec<usize> = d.branches.iter().map(|&(_, id, _)| id as usize).collect();
    let vectors = by_result
        .iter()
        .enumerate()
        .flat_map(|(result, vectors)| vectors.iter().map(move |(_, v)| (result == 1, v)))
        .map(|(result, v)| TestVector {
            conditions: positions.iter().map(|&id| v.visited.get(id).then(|| v.values.get(id))).collect(),
            result,
        })
        .collect();
    Some(McdcRecord {
        decision: d.region,
        folded: d.branches.iter().map(|(r, _, _)| r.count == Counter::ZERO || r.false_count == Counter::ZERO).collect(),
        covered: positions.iter().map(|&id| covered_ids[id]).collect(),
        vectors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::{Body, McdcParameters};

    fn region(kind: RegionKind, line: u32, col: (u32, u32)) -> Region {
        let counter = if kind == RegionKind::McdcDecision { Counter::ZERO } else { Counter::counter(0) };
        Region {
            kind,
            count: counter,
            false_count: counter,
            file_id: 0,
            expanded_file_id: 0,
            line_start: line,
            column_start: col.0,
            line_end: line,
            column_end: col.1,
        }
    }

    /// `a && b` at 1:5-1:11 (a at 1:5, b at 1:10), with the decision's and
    /// the conditions' parameters given.
    fn and2(decision: McdcKind, a: McdcKind, b: McdcKind) -> FunctionMapping {
        let regions = vec![
            region(RegionKind::Code, 1, (1, 20)),
            region(RegionKind::McdcDecision, 1, (5, 11)),
            region(RegionKind::McdcBranch, 1, (5, 6)),
            region(RegionKind::McdcBranch, 1, (10, 11)),
        ];
        let mcdc = vec![
            McdcParameters { region: 1, kind: decision },
            McdcParameters { region: 2, kind: a },
            McdcParameters { region: 3, kind: b },
        ];
        FunctionMapping::decoded(Body::new(Vec::new(), regions, mcdc, 1))
    }

    const DECISION: McdcKind = McdcKind::Decision { bitmap_index: 3, num_conditions: 2 };
    const A: McdcKind = McdcKind::Branch { id: 0, next: [-1, 1] };
    const B: McdcKind = McdcKind::Branch { id: 1, next: [-1, -1] };

    #[test]
    fn a_decision_of_two_conditions() {
        // Vectors: a false (bit 0), a true b false (1), both true (2).
        let f = and2(DECISION, A, B);
        let found = records(&f, &[0b101]);
        assert_eq!(found.len(), 1);
        let r = &found[0];
        assert_eq!(r.covered, vec![true, false]);
        assert_eq!(r.decisions(), (1, 1));
        assert_eq!(r.vectors[0], TestVector { conditions: vec![Some(false), None], result: false });
        assert_eq!(r.vectors[1], TestVector { conditions: vec![Some(true), Some(true)], result: true });
        assert_eq!(r.pairs(), (2, 1));
        // Not in the profile: a record without vectors.
        let unknown = records(&f, &[]);
        assert!(unknown.len() == 1 && unknown[0].vectors.is_empty());
    }

    #[test]
    fn malformed_parameters_drop_the_record_without_a_panic() {
        let bitmap: &[u8] = &[0xff];
        let cases = [
            ("a condition id beyond the decision's", and2(DECISION, A, McdcKind::Branch { id: 2, next: [-1, -1] })),
            ("a condition id twice", and2(DECISION, A, A)),
            ("a negative condition id", and2(DECISION, A, McdcKind::Branch { id: -1, next: [-1, -1] })),
            ("a next id beyond the conditions", and2(DECISION, McdcKind::Branch { id: 0, next: [-1, 7] }, B)),
            ("a next id to the first condition", and2(DECISION, A, McdcKind::Branch { id: 1, next: [0, -1] })),
            ("a cycle", and2(DECISION, A, McdcKind::Branch { id: 1, next: [1, -1] })),
            ("a bitmap index beyond the bitmap", and2(McdcKind::Decision { bitmap_index: 9, num_conditions: 2 }, A, B)),
            ("a bitmap index below the vectors", and2(McdcKind::Decision { bitmap_index: 2, num_conditions: 2 }, A, B)),
            ("more conditions than given", and2(McdcKind::Decision { bitmap_index: 3, num_conditions: 3 }, A, B)),
            ("no condition", and2(McdcKind::Decision { bitmap_index: 3, num_conditions: 0 }, A, B)),
        ];
        for (what, f) in &cases {
            assert!(records(f, bitmap).is_empty(), "{what}");
        }
        // Parameters that do not match their region's kind are ignored.
        let mut f = and2(DECISION, A, B);
        f.body_mut().mcdc[0].kind = A;
        assert!(records(&f, bitmap).is_empty());
        f.body_mut().mcdc.truncate(1);
        f.body_mut().mcdc[0].region = 99;
        assert!(records(&f, bitmap).is_empty());
    }

    #[test]
    fn indices_of_a_chain_of_ands() {
        // a && b && c: 0 -true-> 1 -true-> 2 -true-> outcome.
        let (indices, n) = test_vector_indices(&[[-1, 1], [-1, 2], [-1, -1]]).unwrap();
        assert_eq!(n, 4);
        assert_eq!(indices, vec![[0, 0], [1, 0], [2, 3]]);
    }

    #[test]
    fn malformed_graphs_are_refused() {
        assert!(test_vector_indices(&[[-1, 1], [-1, 0]]).is_none(), "back to the first");
        assert!(test_vector_indices(&[[-1, 1], [2, -1], [1, -1]]).is_none(), "a cycle");
        assert!(test_vector_indices(&[[-1, 5], [-1, -1]]).is_none(), "beyond the last");
        assert!(test_vector_indices(&[[-1, -1], [-1, -1]]).is_none(), "unreachable");
        assert!(test_vector_indices(&[[-2, -1]]).is_none(), "negative");
    }
}
