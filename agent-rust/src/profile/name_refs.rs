//! The `NameRef`s of many names at once: MD5 in four lanes.
//!
//! A names section holds tens of thousands of names (ripgrep's: 22,335,
//! 2.4 MB), and their MD5s were the largest single cost of reading a
//! program's profile (6% of `livecov convert` of ripgrep, on the path the
//! rest waits for). One MD5 is a chain of dependent steps, but the chains of
//! four names are independent: SSE2, which every x86-64 CPU has, runs four
//! side by side (a quarter of the time per name, measured alone). `md-5`
//! hashes one message at a time, and the crates that hash many are young
//! ones; the rounds are written here (RFC 1321) and the tests check every
//! result against `md-5`, which hashes what is left over, and everything on
//! other CPUs.

use super::names::name_ref_bytes;

/// The [`name_ref_bytes`] of each of `names`, in order.
pub(crate) fn name_refs<'a>(names: impl Iterator<Item = &'a [u8]>) -> Vec<u64> {
    let names: Vec<&[u8]> = names.collect();
    let mut refs = vec![0u64; names.len()];
    #[cfg(target_arch = "x86_64")]
    let rest = four_at_a_time(&names, &mut refs);
    #[cfg(not(target_arch = "x86_64"))]
    let rest: Vec<usize> = (0..names.len()).collect();
    for i in rest {
        refs[i] = name_ref_bytes(names[i]);
    }
    refs
}

/// Hashes `names` four of the same number of blocks at a time into
/// `refs`, in the order they come (names are read where they lie, one
/// after the other); returns the indices of those left over.
#[cfg(target_arch = "x86_64")]
fn four_at_a_time(names: &[&[u8]], refs: &mut [u64]) -> Vec<usize> {
    /// Names of more blocks (over a kilobyte) are hashed one by one.
    const MOST_BLOCKS: usize = 16;
    let mut waiting = [([0usize; 4], 0usize); MOST_BLOCKS + 1];
    let mut rest = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let Some((four, n)) = waiting.get_mut(blocks(name.len())) else {
            rest.push(i);
            continue;
        };
        four[*n] = i;
        *n += 1;
        if *n == 4 {
            *n = 0;
            for (&i, digest) in four.iter().zip(md5x4(four.map(|i| names[i]))) {
                refs[i] = digest;
            }
        }
    }
    for (four, n) in waiting {
        rest.extend_from_slice(&four[..n]);
    }
    rest
}

/// 64-byte blocks of a message of `len` bytes once padded: a 1 bit, zeros,
/// and the length in bits as 8 bytes.
#[cfg(target_arch = "x86_64")]
fn blocks(len: usize) -> usize {
    (len + 8) / 64 + 1
}

/// The `len`-byte message's padded block `b` (of [`blocks`]).
#[cfg(target_arch = "x86_64")]
fn padded_block(message: &[u8], b: usize) -> [u8; 64] {
    let mut block = [0u8; 64];
    let from = b * 64;
    let part = message.get(from..).unwrap_or_default();
    let n = part.len().min(64);
    block[..n].copy_from_slice(&part[..n]);
    if from + 64 > message.len() && from <= message.len() {
        block[message.len() - from] = 0x80;
    }
    if b + 1 == blocks(message.len()) {
        block[56..].copy_from_slice(&((message.len() as u64).wrapping_mul(8)).to_le_bytes());
    }
    block
}

/// The low 64 bits of the MD5 digests of four messages of the same number
/// of blocks.
#[cfg(target_arch = "x86_64")]
fn md5x4(messages: [&[u8]; 4]) -> [u64; 4] {
    use std::arch::x86_64::*;

    /// One step of RFC 1321: `$a = $b + ((a + f(b, c, d) + m + k) <<< s)`.
    macro_rules! step {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $m:expr, $k:literal, $s:literal) => {
            let sum = _mm_add_epi32(_mm_add_epi32($a, $f($b, $c, $d)), _mm_add_epi32($m, _mm_set1_epi32($k as u32 as i32)));
            $a = _mm_add_epi32($b, _mm_or_si128(_mm_slli_epi32::<$s>(sum), _mm_srli_epi32::<{ 32 - $s }>(sum)));
        };
    }
    // (b & c) | (!b & d); (b & d) | (c & !d); b ^ c ^ d; c ^ (b | !d).
    #[inline(always)]
    unsafe fn f(b: __m128i, c: __m128i, d: __m128i) -> __m128i {
        _mm_xor_si128(d, _mm_and_si128(b, _mm_xor_si128(c, d)))
    }
    #[inline(always)]
    unsafe fn g(b: __m128i, c: __m128i, d: __m128i) -> __m128i {
        _mm_xor_si128(c, _mm_and_si128(d, _mm_xor_si128(b, c)))
    }
    #[inline(always)]
    unsafe fn h(b: __m128i, c: __m128i, d: __m128i) -> __m128i {
        _mm_xor_si128(_mm_xor_si128(b, c), d)
    }
    #[inline(always)]
    unsafe fn i(b: __m128i, c: __m128i, d: __m128i) -> __m128i {
        _mm_xor_si128(c, _mm_or_si128(b, _mm_xor_si128(d, _mm_set1_epi32(-1))))
    }

    let n = blocks(messages[0].len());
    // Safety: SSE2 is part of x86-64; the loads read 64 bytes of a block
    // that has them.
    unsafe {
        let mut state = [
            _mm_set1_epi32(0x67452301),
            _mm_set1_epi32(0xefcdab89u32 as i32),
            _mm_set1_epi32(0x98badcfeu32 as i32),
            _mm_set1_epi32(0x10325476),
        ];
        for blk in 0..n {
            // Each lane's block as four vectors of four words, then
            // transposed: m[w] holds word w of the four lanes.
            let rows = messages.map(|msg| {
                let padded;
                let block = match msg.get(blk * 64..blk * 64 + 64) {
                    Some(whole) if blk + 1 < n => whole,
                    _ => {
                        padded = padded_block(msg, blk);
                        &padded[..]
                    }
                };
                let at = block.as_ptr().cast::<__m128i>();
                [0, 1, 2, 3].map(|q| _mm_loadu_si128(at.add(q)))
            });
            let mut m = [_mm_setzero_si128(); 16];
            for q in 0..4 {
                let lo01 = _mm_unpacklo_epi32(rows[0][q], rows[1][q]);
                let lo23 = _mm_unpacklo_epi32(rows[2][q], rows[3][q]);
                let hi01 = _mm_unpackhi_epi32(rows[0][q], rows[1][q]);
                let hi23 = _mm_unpackhi_epi32(rows[2][q], rows[3][q]);
                m[4 * q] = _mm_unpacklo_epi64(lo01, lo23);
                m[4 * q + 1] = _mm_unpackhi_epi64(lo01, lo23);
                m[4 * q + 2] = _mm_unpacklo_epi64(hi01, hi23);
                m[4 * q + 3] = _mm_unpackhi_epi64(hi01, hi23);
            }
            let [mut a, mut b, mut c, mut d] = state;
            step!(f, a, b, c, d, m[0], 0xd76aa478, 7);
            step!(f, d, a, b, c, m[1], 0xe8c7b756, 12);
            step!(f, c, d, a, b, m[2], 0x242070db, 17);
            step!(f, b, c, d, a, m[3], 0xc1bdceee, 22);
            step!(f, a, b, c, d, m[4], 0xf57c0faf, 7);
            step!(f, d, a, b, c, m[5], 0x4787c62a, 12);
            step!(f, c, d, a, b, m[6], 0xa8304613, 17);
            step!(f, b, c, d, a, m[7], 0xfd469501, 22);
            step!(f, a, b, c, d, m[8], 0x698098d8, 7);
            step!(f, d, a, b, c, m[9], 0x8b44f7af, 12);
            step!(f, c, d, a, b, m[10], 0xffff5bb1, 17);
            step!(f, b, c, d, a, m[11], 0x895cd7be, 22);
            step!(f, a, b, c, d, m[12], 0x6b901122, 7);
            step!(f, d, a, b, c, m[13], 0xfd987193, 12);
            step!(f, c, d, a, b, m[14], 0xa679438e, 17);
            step!(f, b, c, d, a, m[15], 0x49b40821, 22);

            step!(g, a, b, c, d, m[1], 0xf61e2562, 5);
            step!(g, d, a, b, c, m[6], 0xc040b340, 9);
            step!(g, c, d, a, b, m[11], 0x265e5a51, 14);
            step!(g, b, c, d, a, m[0], 0xe9b6c7aa, 20);
            step!(g, a, b, c, d, m[5], 0xd62f105d, 5);
            step!(g, d, a, b, c, m[10], 0x02441453, 9);
            step!(g, c, d, a, b, m[15], 0xd8a1e681, 14);
            step!(g, b, c, d, a, m[4], 0xe7d3fbc8, 20);
            step!(g, a, b, c, d, m[9], 0x21e1cde6, 5);
            step!(g, d, a, b, c, m[14], 0xc33707d6, 9);
            step!(g, c, d, a, b, m[3], 0xf4d50d87, 14);
            step!(g, b, c, d, a, m[8], 0x455a14ed, 20);
            step!(g, a, b, c, d, m[13], 0xa9e3e905, 5);
            step!(g, d, a, b, c, m[2], 0xfcefa3f8, 9);
            step!(g, c, d, a, b, m[7], 0x676f02d9, 14);
            step!(g, b, c, d, a, m[12], 0x8d2a4c8a, 20);

            step!(h, a, b, c, d, m[5], 0xfffa3942, 4);
            step!(h, d, a, b, c, m[8], 0x8771f681, 11);
            step!(h, c, d, a, b, m[11], 0x6d9d6122, 16);
            step!(h, b, c, d, a, m[14], 0xfde5380c, 23);
            step!(h, a, b, c, d, m[1], 0xa4beea44, 4);
            step!(h, d, a, b, c, m[4], 0x4bdecfa9, 11);
            step!(h, c, d, a, b, m[7], 0xf6bb4b60, 16);
            step!(h, b, c, d, a, m[10], 0xbebfbc70, 23);
            step!(h, a, b, c, d, m[13], 0x289b7ec6, 4);
            step!(h, d, a, b, c, m[0], 0xeaa127fa, 11);
            step!(h, c, d, a, b, m[3], 0xd4ef3085, 16);
            step!(h, b, c, d, a, m[6], 0x04881d05, 23);
            step!(h, a, b, c, d, m[9], 0xd9d4d039, 4);
            step!(h, d, a, b, c, m[12], 0xe6db99e5, 11);
            step!(h, c, d, a, b, m[15], 0x1fa27cf8, 16);
            step!(h, b, c, d, a, m[2], 0xc4ac5665, 23);

            step!(i, a, b, c, d, m[0], 0xf4292244, 6);
            step!(i, d, a, b, c, m[7], 0x432aff97, 10);
            step!(i, c, d, a, b, m[14], 0xab9423a7, 15);
            step!(i, b, c, d, a, m[5], 0xfc93a039, 21);
            step!(i, a, b, c, d, m[12], 0x655b59c3, 6);
            step!(i, d, a, b, c, m[3], 0x8f0ccc92, 10);
            step!(i, c, d, a, b, m[10], 0xffeff47d, 15);
            step!(i, b, c, d, a, m[1], 0x85845dd1, 21);
            step!(i, a, b, c, d, m[8], 0x6fa87e4f, 6);
            step!(i, d, a, b, c, m[15], 0xfe2ce6e0, 10);
            step!(i, c, d, a, b, m[6], 0xa3014314, 15);
            step!(i, b, c, d, a, m[13], 0x4e0811a1, 21);
            step!(i, a, b, c, d, m[4], 0xf7537e82, 6);
            step!(i, d, a, b, c, m[11], 0xbd3af235, 10);
            step!(i, c, d, a, b, m[2], 0x2ad7d2bb, 15);
            step!(i, b, c, d, a, m[9], 0xeb86d391, 21);

            for (s, v) in state.iter_mut().zip([a, b, c, d]) {
                *s = _mm_add_epi32(*s, v);
            }
        }
        let mut words = [[0u32; 4]; 2];
        for (out, v) in words.iter_mut().zip(&state[..2]) {
            _mm_storeu_si128(out.as_mut_ptr().cast(), *v);
        }
        std::array::from_fn(|lane| u64::from(words[0][lane]) | u64::from(words[1][lane]) << 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_refs_are_those_of_md5_one_by_one() {
        // Lengths around every padding boundary, many of each so that
        // they fill lanes, and some left over.
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        let names: Vec<Vec<u8>> =
            (0..2000).map(|i| (0..[0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300][i % 12] + i % 5).map(|_| byte()).collect()).collect();
        let refs = name_refs(names.iter().map(Vec::as_slice));
        for (name, got) in names.iter().zip(refs) {
            assert_eq!(got, name_ref_bytes(name), "the NameRef of a {}-byte name", name.len());
        }
    }
}
