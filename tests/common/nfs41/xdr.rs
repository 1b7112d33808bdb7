//! XDR (RFC 4506), as much as NFSv4.1's COMPOUND needs: big-endian words, opaques padded to four
//! bytes, and a reader that fails instead of panicking on a short reply.

#[derive(Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u32(u32::from(value))
    }

    /// A fixed-length opaque (no length word).
    pub fn fixed(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self.pad(bytes.len())
    }

    /// A variable-length opaque or string.
    pub fn opaque(&mut self, bytes: &[u8]) -> &mut Self {
        self.u32(bytes.len() as u32);
        self.fixed(bytes)
    }

    fn pad(&mut self, len: usize) -> &mut Self {
        self.0.extend(std::iter::repeat_n(0, (4 - len % 4) % 4));
        self
    }
}

pub struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// A reply shorter or other than the protocol says.
#[derive(Debug)]
pub struct Malformed(pub &'static str);

pub type Decoded<T> = Result<T, Malformed>;

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// How many bytes are left to read.
    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    pub fn fixed(&mut self, len: usize) -> Decoded<&'a [u8]> {
        let padded = len + (4 - len % 4) % 4;
        let bytes = self.bytes.get(self.at..self.at + len).ok_or(Malformed("short reply"))?;
        self.at += padded;
        Ok(bytes)
    }

    pub fn u32(&mut self) -> Decoded<u32> {
        Ok(u32::from_be_bytes(self.fixed(4)?.try_into().unwrap()))
    }

    pub fn u64(&mut self) -> Decoded<u64> {
        Ok(u64::from_be_bytes(self.fixed(8)?.try_into().unwrap()))
    }

    pub fn bool(&mut self) -> Decoded<bool> {
        Ok(self.u32()? != 0)
    }

    pub fn opaque(&mut self) -> Decoded<Vec<u8>> {
        let len = self.u32()? as usize;
        Ok(self.fixed(len)?.to_vec())
    }

    /// Skips a bitmap4 (a counted array of words), returning it.
    pub fn bitmap(&mut self) -> Decoded<Vec<u32>> {
        let words = self.u32()?;
        (0..words).map(|_| self.u32()).collect()
    }
}
