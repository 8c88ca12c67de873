//! Small pieces of the programs' wording.

/// `n` and the noun, singular for one: "1 owner", "5 owners".
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(1u32, "owner"), "1 owner");
        assert_eq!(count(0u32, "owner"), "0 owners");
        assert_eq!(count(5usize as u64, "contribution"), "5 contributions");
    }
}
