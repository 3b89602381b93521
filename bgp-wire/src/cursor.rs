//! Checked reads over untrusted bytes.
//!
//! Every read either returns the value and advances, or returns `None` and leaves the reader
//! unchanged. Nothing here indexes, so nothing here can panic; callers turn `None` into the
//! error their context calls for (the same truncation is a header error in one place and an
//! attribute length error in another).

#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline]
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not read yet.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The unread bytes, without consuming them.
    #[inline]
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Consume and return everything left.
    #[inline]
    pub(crate) fn take_rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }

    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.buf.split_first_chunk::<N>()?;
        self.buf = rest;
        Some(*head)
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.buf.split_at_checked(n)?;
        self.buf = rest;
        Some(head)
    }
}

/// Big-endian writers for the encoders. Encoding only ever appends to the caller's buffer,
/// except for length fields, which are patched in place once the body is known.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    /// Overwrite two bytes at `at` with `v`. Does nothing if `at` is out of range, which
    /// cannot happen for offsets the encoder itself recorded.
    fn patch_u16(&mut self, at: usize, v: u16);
}

impl Put for Vec<u8> {
    #[inline]
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    #[inline]
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    #[inline]
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    #[inline]
    fn patch_u16(&mut self, at: usize, v: u16) {
        let [hi, lo] = v.to_be_bytes();
        if let Some(end) = at.checked_add(2)
            && let Some([a, b]) = self.get_mut(at..end)
        {
            *a = hi;
            *b = lo;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_advance_and_stop_at_the_end() {
        let mut r = Reader::new(&[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(r.u8(), Some(1));
        assert_eq!(r.u16(), Some(0x0203));
        assert_eq!(r.u32(), Some(0x0405_0607));
        assert!(r.is_empty());
        assert_eq!(r.u8(), None);
        assert_eq!(r.take(1), None);
        assert_eq!(r.take(0), Some(&[][..]));
    }

    #[test]
    fn a_short_read_leaves_the_reader_unchanged() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32(), None);
        assert_eq!(r.remaining(), 3);
        assert_eq!(r.take(4), None);
        assert_eq!(r.take(2), Some(&[1, 2][..]));
        assert_eq!(r.take_rest(), &[3]);
    }

    #[test]
    fn patch_writes_in_place_and_ignores_out_of_range() {
        let mut v = vec![0u8; 4];
        v.patch_u16(1, 0xABCD);
        assert_eq!(v, [0, 0xAB, 0xCD, 0]);
        v.patch_u16(3, 0xFFFF);
        v.patch_u16(usize::MAX, 0xFFFF);
        assert_eq!(v, [0, 0xAB, 0xCD, 0]);
    }
}
