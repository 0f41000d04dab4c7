//! A small cursor over untrusted bytes.
//!
//! Both LLVM formats the engine reads (raw profiles and coverage mappings)
//! are sequences of fixed-width integers and LEB128 numbers. `Bytes` reads
//! them with the endianness fixed once at construction, and turns every
//! short read into an [`Error::Malformed`] carrying the absolute offset.

use crate::error::{Error, Result};

/// Byte order of an input, detected once from its magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

#[derive(Clone, Debug)]
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of `data[0]` in the whole input, for error messages.
    base: u64,
    endian: Endian,
    what: &'static str,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8], base: u64, endian: Endian, what: &'static str) -> Self {
        Bytes { data, pos: 0, base, endian, what }
    }

    /// Absolute offset of the next byte to read.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn endian(&self) -> Endian {
        self.endian
    }

    /// An error at the current offset.
    pub fn error(&self, detail: impl Into<String>) -> Error {
        Error::malformed(self.what, self.offset(), detail)
    }

    pub fn error_at(&self, position: usize, detail: impl Into<String>) -> Error {
        Error::malformed(self.what, self.base + position as u64, detail)
    }

    #[inline]
    pub fn take(&mut self, len: usize) -> Result<&'a [u8]> {
        if len > self.remaining() {
            return Err(self.short_read(len));
        }
        let bytes = &self.data[self.pos..self.pos + len];
        self.pos += len;
        Ok(bytes)
    }

    // Kept out of line: the readers' loops stay small without the message.
    #[cold]
    #[inline(never)]
    fn short_read(&self, len: usize) -> Error {
        self.error(format!(
            "needs {len} bytes but only {} remain (truncated?)",
            self.remaining()
        ))
    }

    /// A cursor over the next `len` bytes, which this one skips.
    #[inline]
    pub fn split(&mut self, len: usize, what: &'static str) -> Result<Bytes<'a>> {
        let base = self.offset();
        let data = self.take(len)?;
        Ok(Bytes { data, pos: 0, base, endian: self.endian, what })
    }

    #[inline]
    pub fn skip(&mut self, len: usize) -> Result<()> {
        self.take(len).map(|_| ())
    }

    /// Skips to the next multiple of `align` (relative to the input start).
    pub fn align(&mut self, align: u64) -> Result<()> {
        let misalign = self.offset() % align;
        if misalign != 0 {
            self.skip((align - misalign) as usize)?;
        }
        Ok(())
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        match self.data.get(self.pos..self.pos.wrapping_add(N)) {
            Some(bytes) => {
                self.pos += N;
                let mut out = [0; N];
                out.copy_from_slice(bytes);
                Ok(out)
            }
            None => Err(self.short_read(N)),
        }
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    pub fn u16(&mut self) -> Result<u16> {
        let b = self.array()?;
        Ok(match self.endian {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        })
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.array()?;
        Ok(match self.endian {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        })
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.array()?;
        Ok(match self.endian {
            Endian::Little => u64::from_le_bytes(b),
            Endian::Big => u64::from_be_bytes(b),
        })
    }

    /// A pointer-sized field: u32 in 32-bit inputs, u64 otherwise.
    #[inline]
    pub fn pointer(&mut self, is_64: bool) -> Result<u64> {
        if is_64 {
            self.u64()
        } else {
            self.u32().map(u64::from)
        }
    }

    /// An unsigned LEB128 number of at most 64 bits.
    #[inline]
    pub fn uleb(&mut self) -> Result<u64> {
        // Most numbers in coverage mappings fit in one byte.
        if let Some(&byte) = self.data.get(self.pos) {
            if byte & 0x80 == 0 {
                self.pos += 1;
                return Ok(u64::from(byte));
            }
        }
        self.uleb_long()
    }

    fn uleb_long(&mut self) -> Result<u64> {
        let start = self.pos;
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = self.u8()?;
            let low = u64::from(byte & 0x7f);
            if shift >= 64 || (shift == 63 && low > 1) {
                return Err(self.error_at(start, "LEB128 number does not fit in 64 bits"));
            }
            value |= low << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
        }
    }

    /// A LEB128 number that must fit in 32 bits (counts, indices, lines).
    #[inline]
    pub fn uleb32(&mut self) -> Result<u32> {
        let start = self.pos;
        let v = self.uleb()?;
        match u32::try_from(v) {
            Ok(v) => Ok(v),
            Err(_) => Err(self.too_large(start, v)),
        }
    }

    #[cold]
    #[inline(never)]
    fn too_large(&self, start: usize, v: u64) -> Error {
        self.error_at(start, format!("value {v} does not fit in 32 bits"))
    }

    /// A LEB128 length of something that follows, checked against what remains.
    #[inline]
    pub fn uleb_len(&mut self) -> Result<usize> {
        let start = self.pos;
        let v = self.uleb()?;
        if v > self.remaining() as u64 {
            return Err(self.too_long(start, v));
        }
        Ok(v as usize)
    }

    #[cold]
    #[inline(never)]
    fn too_long(&self, start: usize, v: u64) -> Error {
        self.error_at(start, format!("length {v} exceeds the {} bytes that remain", self.remaining()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128_values_and_overflow() {
        let mut b = Bytes::new(&[0xe5, 0x8e, 0x26, 0x7f], 0, Endian::Little, "test");
        assert_eq!(b.uleb().unwrap(), 624485);
        assert_eq!(b.uleb().unwrap(), 127);
        let too_long = [0xff; 11];
        let mut b = Bytes::new(&too_long, 16, Endian::Little, "test");
        let err = b.uleb().unwrap_err().to_string();
        assert!(err.contains("offset 0x10"), "{err}");
    }

    #[test]
    fn short_read_names_offset() {
        let mut b = Bytes::new(&[1, 2, 3], 0x100, Endian::Big, "raw profile header");
        assert_eq!(b.u16().unwrap(), 0x0102);
        let err = b.u32().unwrap_err().to_string();
        assert_eq!(err, "malformed raw profile header at offset 0x102: needs 4 bytes but only 1 remain (truncated?)");
    }
}
