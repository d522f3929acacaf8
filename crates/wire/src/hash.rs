//! The key hash Pulsar uses wherever a message key picks something: the
//! partition a keyed message goes to (clients' default router) and the
//! Key_Shared consumer that gets it (brokers). Both sides must agree bit for
//! bit with the Java implementation (`Murmur3_32Hash.makeHash`).
//!
//! Owns: the hash function. Never: the modulus (partition count, slot count),
//! which the caller applies.

/// Murmur3 x86 32-bit, seed 0, then `& i32::MAX` (Java's `makeHash`).
pub fn murmur3_32_masked(key: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    fn mix_k1(k1: u32) -> u32 {
        k1.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
    }
    let mut h1: u32 = 0;
    let mut chunks = key.chunks_exact(4);
    for chunk in &mut chunks {
        let k1 = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        h1 ^= mix_k1(k1);
        h1 = h1.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let mut k1: u32 = 0;
    for (i, byte) in chunks.remainder().iter().enumerate() {
        k1 ^= u32::from(*byte) << (i * 8);
    }
    h1 ^= mix_k1(k1);
    // The length is mixed in as a Java int: truncation of absurd lengths is
    // what Java does too.
    h1 ^= key.len() as u32;
    h1 ^= h1 >> 16;
    h1 = h1.wrapping_mul(0x85eb_ca6b);
    h1 ^= h1 >> 13;
    h1 = h1.wrapping_mul(0xc2b2_ae35);
    h1 ^= h1 >> 16;
    h1 & 0x7fff_ffff
}

#[cfg(test)]
mod tests {
    use super::murmur3_32_masked;

    #[test]
    fn known_values() {
        // Murmur3 x86_32 with seed 0 of these inputs (published test vectors),
        // masked to 31 bits.
        assert_eq!(murmur3_32_masked(b""), 0);
        assert_eq!(murmur3_32_masked(b"hello"), 0x248b_fa47 & 0x7fff_ffff);
        assert_eq!(
            murmur3_32_masked(b"Hello, world!"),
            0xc036_3e43 & 0x7fff_ffff
        );
        assert_eq!(
            murmur3_32_masked(b"The quick brown fox jumps over the lazy dog"),
            0x2e4f_f723 & 0x7fff_ffff
        );
    }
}
