//! Which bookies hold a new ensemble, or replace a failed one.
//!
//! Owns: the placement rule: random among the available bookies that are not
//! read-only, spread across racks when bookies carry rack labels (each pick goes
//! to a rack with the fewest members already in the ensemble). Pure: the caller passes the candidates and
//! the RNG (seeded in tests, so placement replays).
//! Never: talks to the registry or to bookies.

use rand::Rng;

use crate::error::LedgerError;
use crate::types::BookieId;

/// A bookie the registry lists as available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BookieCandidate {
    /// Registry id.
    pub(crate) id: BookieId,
    /// Rack label, if the bookie has one (unlabelled bookies share one rack).
    pub(crate) rack: Option<String>,
    /// Marked read-only (disk almost full or failing): never picked.
    pub(crate) read_only: bool,
}

/// Picks `count` bookies from `candidates`, none of them read-only, in `keep`
/// (the ensemble members that stay) or `exclude`, spreading across racks
/// relative to `keep`. Returned in pick order.
pub(crate) fn choose<R: Rng>(
    candidates: &[BookieCandidate],
    keep: &[BookieId],
    exclude: &[BookieId],
    count: usize,
    rng: &mut R,
) -> Result<Vec<BookieId>, LedgerError> {
    let mut pool: Vec<&BookieCandidate> = candidates
        .iter()
        .filter(|c| !c.read_only && !keep.contains(&c.id) && !exclude.contains(&c.id))
        .collect();
    // Sorted so the RNG's choices do not depend on the registry's listing order.
    pool.sort_by(|a, b| a.id.cmp(&b.id));
    pool.dedup_by(|a, b| a.id == b.id);
    if pool.len() < count {
        return Err(LedgerError::NotEnoughBookies {
            needed: count,
            available: pool.len(),
            read_only: candidates.iter().filter(|c| c.read_only).count(),
        });
    }
    let rack_of = |id: &BookieId| -> Option<&str> {
        candidates
            .iter()
            .find(|c| &c.id == id)
            .and_then(|c| c.rack.as_deref())
    };
    let mut used_racks: Vec<Option<&str>> = keep.iter().map(rack_of).collect();
    let mut chosen = Vec::with_capacity(count);
    for _ in 0..count {
        let usage = |rack: Option<&str>| used_racks.iter().filter(|r| **r == rack).count();
        let least = pool
            .iter()
            .map(|c| usage(c.rack.as_deref()))
            .min()
            .unwrap_or(0);
        let best: Vec<usize> = (0..pool.len())
            .filter(|&i| usage(pool[i].rack.as_deref()) == least)
            .collect();
        let pick = best[rng.random_range(0..best.len())];
        let candidate = pool.remove(pick);
        used_racks.push(candidate.rack.as_deref());
        chosen.push(candidate.id.clone());
    }
    Ok(chosen)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn candidate(id: &str, rack: Option<&str>) -> BookieCandidate {
        BookieCandidate {
            id: BookieId::new(id),
            rack: rack.map(str::to_owned),
            read_only: false,
        }
    }

    #[test]
    fn picks_distinct_bookies_outside_keep_and_exclude() {
        let all: Vec<_> = (0..6).map(|i| candidate(&format!("b{i}"), None)).collect();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let keep = [BookieId::new("b0")];
            let exclude = [BookieId::new("b1")];
            let picked = choose(&all, &keep, &exclude, 3, &mut rng).unwrap();
            assert_eq!(picked.len(), 3);
            assert!(!picked.contains(&keep[0]) && !picked.contains(&exclude[0]));
            let mut dedup = picked.clone();
            dedup.sort();
            dedup.dedup();
            assert_eq!(dedup.len(), 3);
        }
        assert!(matches!(
            choose(&all, &[], &[], 7, &mut rng),
            Err(LedgerError::NotEnoughBookies {
                needed: 7,
                available: 6,
                read_only: 0,
            })
        ));
    }

    #[test]
    fn never_picks_a_read_only_bookie() {
        let mut all: Vec<_> = (0..4).map(|i| candidate(&format!("b{i}"), None)).collect();
        all[1].read_only = true;
        all[3].read_only = true;
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..50 {
            let mut picked = choose(&all, &[], &[], 2, &mut rng).unwrap();
            picked.sort();
            assert_eq!(picked, vec![BookieId::new("b0"), BookieId::new("b2")]);
        }
        let error = choose(&all, &[], &[], 3, &mut rng).unwrap_err();
        assert!(matches!(
            error,
            LedgerError::NotEnoughBookies {
                needed: 3,
                available: 2,
                read_only: 2
            }
        ));
        assert!(error.to_string().contains("2 read-only"), "{error}");
    }

    #[test]
    fn spreads_across_racks() {
        let all = vec![
            candidate("a1", Some("A")),
            candidate("a2", Some("A")),
            candidate("a3", Some("A")),
            candidate("b1", Some("B")),
            candidate("c1", Some("C")),
        ];
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..50 {
            let picked = choose(&all, &[], &[], 3, &mut rng).unwrap();
            let mut racks: Vec<char> = picked.iter().map(|b| b.0.chars().next().unwrap()).collect();
            racks.sort();
            assert_eq!(racks, vec!['a', 'b', 'c'], "{picked:?}");
            // Replacing c1: the only free bookies left are in rack A.
            let keep = [BookieId::new("a1"), BookieId::new("b1")];
            let replacement = choose(&all, &keep, &[BookieId::new("c1")], 1, &mut rng).unwrap();
            assert!(replacement[0].0.starts_with('a'));
        }
    }

    #[test]
    fn same_seed_same_choice() {
        let all: Vec<_> = (0..9).map(|i| candidate(&format!("b{i}"), None)).collect();
        let pick = |seed| choose(&all, &[], &[], 3, &mut StdRng::seed_from_u64(seed)).unwrap();
        assert_eq!(pick(5), pick(5));
    }
}
