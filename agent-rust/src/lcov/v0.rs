//! A fast path for demangling Rust v0 symbols, as `rustc-demangle` prints
//! them with `{:#}` (no crate hashes).
//!
//! Reports of Rust programs name every function by its v0 symbol, and
//! `rustc-demangle` spends most of its time in `fmt` plumbing and in a
//! validating pass before the printing one: on large programs demangling
//! was the largest single cost of a report. This parser prints while it
//! parses, straight into the report buffer, and covers the grammar real
//! function symbols use: paths, generic arguments, types, lifetimes, `fn`
//! and `dyn` types and integer and bool constants.
//!
//! It gives up (returns `None`, leaving the buffer as it was) on anything
//! else, and on anything `rustc-demangle` would not print plainly: punycode
//! identifiers, other constants, suffixes, errors, deep nesting. The caller
//! then asks `rustc-demangle`, so what it prints is always exactly what
//! `rustc-demangle` prints (the tests below compare the two, on real
//! symbols and on thousands of mutations of them).

/// Nesting (paths, types, backrefs) beyond which the parser gives up, below
/// `rustc-demangle`'s own limit (500) so that its message stays its own.
const MAX_DEPTH: u32 = 400;
/// Output beyond which the parser gives up (`rustc-demangle` stops at 1 MB).
const MAX_OUTPUT: usize = 64 * 1024;

/// Appends the demangled form of `symbol` to `out` and returns `Some`, or
/// leaves `out` as it was and returns `None` when the symbol is not one
/// this parser handles.
pub(super) fn demangle_into(symbol: &str, out: &mut String) -> Option<()> {
    let inner = symbol.strip_prefix("_R")?;
    // Paths start with an uppercase letter; rustc-demangle refuses
    // non-ASCII symbols, and treats `.llvm.` and what follows a `.` apart.
    let bytes = inner.as_bytes();
    if !bytes.first()?.is_ascii_uppercase() || !inner.is_ascii() || memchr::memchr(b'.', bytes).is_some() {
        return None;
    }
    let start = out.len();
    let mut p = Printer { text: inner, sym: bytes, pos: 0, out, start, skip: false, depth: 0, bound_lifetimes: 0 };
    let printed = p.path(true).and_then(|()| {
        // The instantiating crate, not printed.
        if p.peek().is_some_and(|b| b.is_ascii_uppercase()) {
            p.skip_path()?;
        }
        (p.pos == p.sym.len() && p.out.len() - start <= MAX_OUTPUT).then_some(())
    });
    if printed.is_none() {
        out.truncate(start);
    }
    printed
}

struct Printer<'s, 'o> {
    /// The symbol without `_R`: backrefs are offsets into it.
    text: &'s str,
    /// `text` as bytes.
    sym: &'s [u8],
    pos: usize,
    out: &'o mut String,
    /// Where this symbol's output starts in `out`.
    start: usize,
    /// Parsing without printing (and without following backrefs), as
    /// rustc-demangle does for the path of an impl.
    skip: bool,
    depth: u32,
    /// Lifetimes bound by the `for<...>` binders around the current type.
    bound_lifetimes: u32,
}

impl<'s> Printer<'s, '_> {
    fn print(&mut self, s: &str) {
        if !self.skip {
            self.out.push_str(s);
        }
    }

    fn print_number(&mut self, n: u64) {
        if !self.skip {
            self.out.push_str(itoa::Buffer::new().format(n));
        }
    }

    fn peek(&self) -> Option<u8> {
        self.sym.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn eat(&mut self, b: u8) -> bool {
        let found = self.peek() == Some(b);
        self.pos += usize::from(found);
        found
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// A base-62 number: `_` is 0, digits then `_` are one more than their
    /// value. Summed in a u128, which 21 digits cannot overflow: a longer
    /// number (leading zeros, or too large for a u64 anyway) is left to
    /// rustc-demangle. Crate roots carry 11 digits each.
    fn integer_62(&mut self) -> Option<u64> {
        if self.eat(b'_') {
            return Some(0);
        }
        let start = self.pos;
        let mut x: u128 = 0;
        loop {
            let b = self.next()?;
            if b == b'_' {
                break;
            }
            let d = BASE_62[usize::from(b)];
            if d == NOT_BASE_62 || self.pos - start > 21 {
                return None;
            }
            x = x * 62 + u128::from(d);
        }
        u64::try_from(x).ok()?.checked_add(1)
    }

    fn opt_integer_62(&mut self, tag: u8) -> Option<u64> {
        if !self.eat(tag) {
            return Some(0);
        }
        self.integer_62()?.checked_add(1)
    }

    fn disambiguator(&mut self) -> Option<u64> {
        self.opt_integer_62(b's')
    }

    /// An identifier; punycode ones are left to rustc-demangle.
    fn ident(&mut self) -> Option<&'s str> {
        if self.peek() == Some(b'u') {
            return None;
        }
        let mut len = usize::from(self.peek().filter(u8::is_ascii_digit)? - b'0');
        self.pos += 1;
        if len != 0 {
            while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
                len = len.checked_mul(10)?.checked_add(usize::from(d - b'0'))?;
                self.pos += 1;
            }
        }
        self.eat(b'_');
        let start = self.pos;
        self.pos = self.pos.checked_add(len).filter(|&end| end <= self.sym.len())?;
        let text = self.text;
        text.get(start..self.pos)
    }

    fn print_ident(&mut self) -> Option<()> {
        let ident = self.ident()?;
        self.print(ident);
        Some(())
    }

    /// Follows a backref (its `B` already eaten) with `f`; when skipping,
    /// only parses it.
    fn backref(&mut self, f: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        let at = self.pos - 1;
        let target = self.integer_62()?;
        if target >= at as u64 {
            return None;
        }
        if self.skip {
            return Some(());
        }
        if self.out.len() - self.start > MAX_OUTPUT {
            return None;
        }
        self.enter()?;
        let resume = std::mem::replace(&mut self.pos, target as usize);
        f(self)?;
        self.pos = resume;
        self.leave();
        Some(())
    }

    /// A path rustc-demangle parses without printing (an impl's own path).
    fn skip_path(&mut self) -> Option<()> {
        let skip = std::mem::replace(&mut self.skip, true);
        self.path(false)?;
        self.skip = skip;
        Some(())
    }

    fn path(&mut self, in_value: bool) -> Option<()> {
        self.enter()?;
        match self.next()? {
            b'C' => {
                self.disambiguator()?;
                self.print_ident()?;
            }
            b'N' => {
                let namespace = match self.next()? {
                    ns @ b'A'..=b'Z' => Some(ns),
                    b'a'..=b'z' => None,
                    _ => return None,
                };
                self.path(in_value)?;
                let disambiguator = self.disambiguator()?;
                let name = self.ident()?;
                match namespace {
                    // Closures, shims and other special namespaces.
                    Some(ns) => {
                        self.print("::{");
                        match ns {
                            b'C' => self.print("closure"),
                            b'S' => self.print("shim"),
                            _ => self.print(std::str::from_utf8(&[ns]).ok()?),
                        }
                        if !name.is_empty() {
                            self.print(":");
                            self.print(name);
                        }
                        self.print("#");
                        self.print_number(disambiguator);
                        self.print("}");
                    }
                    None if !name.is_empty() => {
                        self.print("::");
                        self.print(name);
                    }
                    None => {}
                }
            }
            tag @ (b'M' | b'X' | b'Y') => {
                if tag != b'Y' {
                    self.disambiguator()?;
                    self.skip_path()?;
                }
                self.print("<");
                self.ty()?;
                if tag != b'M' {
                    self.print(" as ");
                    self.path(false)?;
                }
                self.print(">");
            }
            b'I' => {
                self.path(in_value)?;
                if in_value {
                    self.print("::");
                }
                self.print("<");
                self.list(Self::generic_arg, ", ")?;
                self.print(">");
            }
            b'B' => self.backref(|p| p.path(in_value))?,
            _ => return None,
        }
        self.leave();
        Some(())
    }

    /// Elements printed with `f` and separated by `sep`, up to an `E`;
    /// returns how many.
    fn list(&mut self, f: impl Fn(&mut Self) -> Option<()>, sep: &str) -> Option<usize> {
        let mut count = 0;
        while !self.eat(b'E') {
            if count > 0 {
                self.print(sep);
            }
            f(self)?;
            count += 1;
        }
        Some(count)
    }

    fn generic_arg(&mut self) -> Option<()> {
        if self.eat(b'L') {
            let lifetime = self.integer_62()?;
            self.lifetime(lifetime)
        } else if self.eat(b'K') {
            self.constant()
        } else {
            self.ty()
        }
    }

    /// `'_` for 0, else a lifetime bound by an enclosing binder: `'a`,
    /// `'b`, ... then `'_26`, ...
    fn lifetime(&mut self, index: u64) -> Option<()> {
        if self.skip {
            return Some(());
        }
        self.print("'");
        if index == 0 {
            self.print("_");
            return Some(());
        }
        let depth = u64::from(self.bound_lifetimes).checked_sub(index)?;
        if depth < 26 {
            let letter = [b'a' + depth as u8];
            self.print(std::str::from_utf8(&letter).ok()?);
        } else {
            self.print("_");
            self.print_number(depth);
        }
        Some(())
    }

    /// Runs `f` inside an optional `for<'a, ...>` binder.
    fn binder(&mut self, f: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        let bound = self.opt_integer_62(b'G')?;
        if self.skip {
            return f(self);
        }
        let bound = u32::try_from(bound).ok().filter(|&n| n <= 26)?;
        if bound > 0 {
            self.print("for<");
            for i in 0..bound {
                if i > 0 {
                    self.print(", ");
                }
                self.bound_lifetimes += 1;
                self.lifetime(1)?;
            }
            self.print("> ");
        }
        f(self)?;
        self.bound_lifetimes -= bound;
        Some(())
    }

    fn ty(&mut self) -> Option<()> {
        let tag = self.next()?;
        if let Some(name) = basic_type(tag) {
            self.print(name);
            return Some(());
        }
        self.enter()?;
        match tag {
            b'R' | b'Q' => {
                self.print("&");
                if self.eat(b'L') {
                    let lifetime = self.integer_62()?;
                    if lifetime != 0 {
                        self.lifetime(lifetime)?;
                        self.print(" ");
                    }
                }
                if tag == b'Q' {
                    self.print("mut ");
                }
                self.ty()?;
            }
            b'P' | b'O' => {
                self.print(if tag == b'P' { "*const " } else { "*mut " });
                self.ty()?;
            }
            b'A' | b'S' => {
                self.print("[");
                self.ty()?;
                if tag == b'A' {
                    self.print("; ");
                    self.constant()?;
                }
                self.print("]");
            }
            b'T' => {
                self.print("(");
                if self.list(Self::ty, ", ")? == 1 {
                    self.print(",");
                }
                self.print(")");
            }
            b'F' => self.binder(Self::fn_type)?,
            b'D' => {
                self.print("dyn ");
                self.binder(|p| p.list(Self::dyn_trait, " + ").map(drop))?;
                if !self.eat(b'L') {
                    return None;
                }
                let lifetime = self.integer_62()?;
                if lifetime != 0 {
                    self.print(" + ");
                    self.lifetime(lifetime)?;
                }
            }
            b'B' => self.backref(Self::ty)?,
            // `w` (splat) and `W` (pattern types) are left to rustc-demangle.
            b'w' | b'W' => return None,
            _ => {
                self.pos -= 1;
                self.path(false)?;
            }
        }
        self.leave();
        Some(())
    }

    /// A `fn` type after its binder: `unsafe extern "C" fn(A, B) -> R`.
    fn fn_type(&mut self) -> Option<()> {
        let is_unsafe = self.eat(b'U');
        let abi = if !self.eat(b'K') {
            None
        } else if self.eat(b'C') {
            Some("C")
        } else {
            let abi = self.ident()?;
            if abi.is_empty() {
                return None;
            }
            Some(abi)
        };
        if is_unsafe {
            self.print("unsafe ");
        }
        if let Some(abi) = abi {
            // `-` in an ABI name is mangled as `_`.
            let abi = abi.replace('_', "-");
            self.print("extern \"");
            self.print(&abi);
            self.print("\" ");
        }
        self.print("fn(");
        self.list(Self::ty, ", ")?;
        self.print(")");
        if !self.eat(b'u') {
            self.print(" -> ");
            self.ty()?;
        }
        Some(())
    }

    /// A trait of a `dyn` type, with its associated type bindings inside
    /// its generic arguments: `Trait<A, Output = B>`.
    fn dyn_trait(&mut self) -> Option<()> {
        let mut open = self.path_maybe_open_generics()?;
        while self.eat(b'p') {
            self.print(if open { ", " } else { "<" });
            open = true;
            self.print_ident()?;
            self.print(" = ");
            if self.eat(b'K') {
                self.constant()?;
            } else {
                self.ty()?;
            }
        }
        if open {
            self.print(">");
        }
        Some(())
    }

    /// A path whose generic arguments are left open (returns `true`) for
    /// associated type bindings to follow.
    fn path_maybe_open_generics(&mut self) -> Option<bool> {
        if self.eat(b'B') {
            let mut open = false;
            self.backref(|p| {
                open = p.path_maybe_open_generics()?;
                Some(())
            })?;
            Some(open)
        } else if self.eat(b'I') {
            self.path(false)?;
            self.print("<");
            self.list(Self::generic_arg, ", ")?;
            Some(true)
        } else {
            self.path(false)?;
            Some(false)
        }
    }

    /// A constant generic argument or array length: integers, bools and `_`;
    /// the others are left to rustc-demangle.
    fn constant(&mut self) -> Option<()> {
        let tag = self.next()?;
        self.enter()?;
        match tag {
            b'p' => self.print("_"),
            b'h' | b't' | b'm' | b'y' | b'o' | b'j' => self.const_uint()?,
            b'a' | b's' | b'l' | b'x' | b'n' | b'i' => {
                if self.eat(b'n') {
                    self.print("-");
                }
                self.const_uint()?;
            }
            b'b' => match self.hex_nibbles()? {
                "0" => self.print("false"),
                "1" => self.print("true"),
                _ => return None,
            },
            b'B' => self.backref(Self::constant)?,
            _ => return None,
        }
        self.leave();
        Some(())
    }

    /// Hex digits up to a `_`, printed in decimal; longer ones than fit in
    /// a u64 are left to rustc-demangle.
    fn const_uint(&mut self) -> Option<()> {
        let nibbles = self.hex_nibbles()?.trim_start_matches('0');
        if nibbles.len() > 16 {
            return None;
        }
        let value = nibbles.bytes().fold(0u64, |v, d| v << 4 | u64::from((d as char).to_digit(16).unwrap_or(0)));
        self.print_number(value);
        Some(())
    }

    fn hex_nibbles(&mut self) -> Option<&'s str> {
        let start = self.pos;
        loop {
            match self.next()? {
                b'0'..=b'9' | b'a'..=b'f' => {}
                b'_' => break,
                _ => return None,
            }
        }
        let text = self.text;
        text.get(start..self.pos - 1)
    }
}

/// The value of each base-62 digit, [`NOT_BASE_62`] for other bytes.
const BASE_62: [u8; 256] = {
    let mut table = [NOT_BASE_62; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            d @ b'0'..=b'9' => d - b'0',
            d @ b'a'..=b'z' => 10 + d - b'a',
            d @ b'A'..=b'Z' => 36 + d - b'A',
            _ => NOT_BASE_62,
        };
        b += 1;
    }
    table
};
const NOT_BASE_62: u8 = u8::MAX;

fn basic_type(tag: u8) -> Option<&'static str> {
    Some(match tag {
        b'b' => "bool",
        b'c' => "char",
        b'e' => "str",
        b'u' => "()",
        b'a' => "i8",
        b's' => "i16",
        b'l' => "i32",
        b'x' => "i64",
        b'n' => "i128",
        b'i' => "isize",
        b'h' => "u8",
        b't' => "u16",
        b'm' => "u32",
        b'y' => "u64",
        b'o' => "u128",
        b'j' => "usize",
        b'f' => "f32",
        b'd' => "f64",
        b'z' => "!",
        b'p' => "_",
        b'v' => "...",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the report prints for `symbol`: the fast path's output, or
    /// `None` when it leaves the symbol to rustc-demangle.
    fn fast(symbol: &str) -> Option<String> {
        let mut out = String::from("FN:1,");
        let printed = demangle_into(symbol, &mut out);
        match printed {
            Some(()) => Some(out["FN:1,".len()..].to_owned()),
            None => {
                assert_eq!(out, "FN:1,", "{symbol}: a refused symbol must leave the buffer as it was");
                None
            }
        }
    }

    fn reference(symbol: &str) -> Option<String> {
        rustc_demangle::try_demangle(symbol).ok().map(|d| format!("{d:#}"))
    }

    /// Function symbols of real programs (rustc 1.95, `-C instrument-coverage`),
    /// and cases from rustc-demangle's own tests.
    const HANDLED: &[&str] = &[
        "_RNvCs6GmmlP4bgsG_1r4main",
        "_RINvCs6GmmlP4bgsG_1r1gReEB2_",
        "_RNCNvCs6GmmlP4bgsG_1r4main0B3_",
        "_RINvMs0_NtCs124dsyiE6fm_12aho_corasick11ahocorasickNtB6_11AhoCorasick8try_findNtNtNtB8_4util6search5InputECsj8Ribnljmd_14regex_automata",
        "_RINvMs6_NtCs124dsyiE6fm_12aho_corasick11ahocorasickNtB6_18AhoCorasickBuilder5buildRSINtNtCslNYArtu3iFV_5alloc3vec3VechERB1k_ECsj8Ribnljmd_14regex_automata",
        "_RINvCs3mSbOeLENLV_4test28___rust_begin_short_backtraceINtNtCsgEmfK2I1SDS_4core6result6ResultuNtNtCslNYArtu3iFV_5alloc6string6StringEINtNtB1x_5boxed3BoxDINtNtNtBV_3ops8function6FnOnceuEp6OutputBQ_NtNtBV_6marker4SendEL_EEB2_",
        "_RNvNtCs1234_7mycrate3foo3bar",
        "_RNCNCNgCs6DXkGYLi8lr_2cc5spawn00B5_",
        "_RNCINkXs25_NgCsbmNqQUJIY6D_4core5sliceINyB9_4IterhENuNgNoBb_4iter8iterator8Iterator9rpositionNCNgNpB9_6memchr7memrchrs_0E0Bb_",
        "_RINbNbCskIICzLVDPPb_5alloc5alloc8box_freeDINbNiB4_5boxed5FnBoxuEp6OutputuEL_ECs1iopQbuBiw2_3std",
        "_RMC0INtC8arrayvec8ArrayVechKj7b_E",
        "_RIC0KpE",
        "_RIC0Kanb_E",
        "_RIC0Kb1_E",
        "_RNvMNtCsgEmfK2I1SDS_4core6optionINtB2_6OptionFG_ttRL0_ShETttEE9unwrap_orCsfd8vrCX07yt_12simd_adler32",
        "_RNvMNtNtCsjrHSEGnQ3l9_3std4sync9once_lockINtB2_8OnceLockFUKClElE3getCsnnstCnHcsU_7service",
        "_RINvNtCsgEmfK2I1SDS_4core3ptr13drop_in_placeDG0_INtNtNtB4_3ops8function2FnTRL1_INtNtNtCskuKo5k9NCmR_5tokio7runtime10task_hooks8TaskMetaL0_EEEp6OutputuNtNtB4_6marker4SyncNtB2q_4SendEL_EB1m_",
        "_RNvXs1g_NtCsgEmfK2I1SDS_4core3fmtRDNtB6_5DebugEL_Bx_3fmtB8_",
        "_RINvMsh_NtCsfYWDzy2Vjlh_9hashbrown3rawINtB6_12RawIterRangejE9next_implKb0_ECs9XwYsndGIum_5large",
        "_RINvMs5_NtNtCsj8Ribnljmd_14regex_automata4util8capturesNtB6_9GroupInfo3newAAINtNtCsgEmfK2I1SDS_4core6option6OptionReEj1_B1R_B1b_B1O_EBa_",
        "_RNvXss_CshKRJwbKmIOk_4itoatNtB5_8Unsigned3fmt",
        "_RNvYdNtCs8brfurfeH0F_4zmij11FloatTraits7get_expB5_",
        "_RNvMNtCsgEmfK2I1SDS_4core5sliceSTNtNtNtCs14pMvfZMm5d_12clap_builder7builder3str3StrbE4iterBB_",
        "_RNvXsq_NtCsgEmfK2I1SDS_4core3fmtONtNtB7_3ffi6c_voidNtB5_5Debug3fmtCsjrHSEGnQ3l9_3std",
        "_RMC0TE",
        "_RMC0TlE",
        "_RNvC3foo7a$b_c_d",
    ];

    /// Left to rustc-demangle: suffixes, punycode, other constants, errors.
    const REFUSED: &[&str] = &[
        "_RC3foo.llvm.9D1C9369",
        "_RNvNtNtNtNtCs92dm3009vxr_4rand4rngs7adapter9reseeding4fork23FORK_HANDLER_REGISTERED.0.0",
        "_RNqCs4fqI2P2rA04_11utf8_identsu30____7hkackfecea1cbdathfdh9hlq6y",
        "_RIC0Ke616263_E",
        "_RIC0Koff00ff00ff00ff00ff_E",
        "_RMC0WmRm1_m9_",
        "_RNvC3foo",
        "_RNvC3foo3barX",
        "_RB_",
        // Base-62 numbers of more than 21 digits (here leading zeros), and
        // past a u64.
        "_RNvCs0000000000000000000001_1r4main",
        "_RNvCsZZZZZZZZZZZ_1r4main",
        "_RC9a.llvm.AB",
        "_ZN3foo3barE",
        "main",
        "_R",
    ];

    #[test]
    fn handled_symbols_print_as_rustc_demangle_prints_them() {
        for symbol in HANDLED {
            let ours = fast(symbol).unwrap_or_else(|| panic!("{symbol} was left to rustc-demangle"));
            assert_eq!(Some(ours), reference(symbol), "{symbol}");
        }
    }

    #[test]
    fn others_are_left_to_rustc_demangle() {
        for symbol in REFUSED {
            assert_eq!(fast(symbol), None, "{symbol}");
        }
    }

    /// Every prefix, and every symbol with one byte replaced by another
    /// symbol character, either is refused or prints as rustc-demangle
    /// prints it.
    #[test]
    fn mutated_symbols_never_print_differently() {
        let alphabet: Vec<u8> = (b'0'..=b'9').chain(b'a'..=b'z').chain(b'A'..=b'Z').chain([b'_']).collect();
        let mut checked = 0;
        for symbol in HANDLED {
            let bytes = symbol.as_bytes();
            let mut variants: Vec<Vec<u8>> = (3..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
            for at in 2..bytes.len() {
                for &b in alphabet.iter().step_by(3) {
                    let mut v = bytes.to_vec();
                    v[at] = b;
                    variants.push(v);
                }
            }
            for v in variants {
                let v = String::from_utf8(v).expect("ASCII");
                if let Some(ours) = fast(&v) {
                    assert_eq!(Some(ours), reference(&v), "{v}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 1000, "only {checked} mutants took the fast path");
    }
}
