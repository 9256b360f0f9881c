//! Named statements that a pooled `/sql` backend connection keeps prepared, by query text, so a
//! repeated query is bound and run without Postgres parsing and planning it again (as a driver's
//! statement cache does for its own connection).
//!
//! The cache only knows what the backend confirmed: an entry is added when its ParseComplete
//! arrives. A session reset (`DISCARD ALL`) drops every statement, so the cache is emptied with
//! it. When the backend no longer has a statement the cache names (a user's `DEALLOCATE`), the
//! request is run again without the cache and the connection is reset.

use std::collections::HashMap;

/// Bounds of one connection's statement cache (`http.statement_cache`,
/// `http.statement_cache_max_query`).
#[derive(Clone, Copy, Debug)]
pub struct CacheLimits {
    /// Statements kept per connection; 0 turns the cache off.
    pub capacity: usize,
    /// Longer query texts are never cached (they are parsed each time, as without a cache).
    pub max_query: usize,
}

/// How one statement of a request is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prepared {
    /// Bound to a statement the backend already has.
    Cached(Box<str>),
    /// Parsed under this new name, cached once the backend confirms the Parse.
    New(Box<str>),
    /// Parsed as the unnamed statement, not cached.
    Unnamed,
}

impl Prepared {
    /// The statement name for Parse and Bind (empty for the unnamed statement).
    pub fn name(&self) -> &str {
        match self {
            Prepared::Cached(n) | Prepared::New(n) => n,
            Prepared::Unnamed => "",
        }
    }
}

struct Entry {
    name: Box<str>,
    /// The request that used it last, for least-recently-used eviction.
    used: u64,
}

/// One connection's prepared statements, by query text.
#[derive(Default)]
pub struct StatementCache {
    by_query: HashMap<Box<str>, Entry>,
    /// Requests planned so far; also what makes names unique on the connection.
    request: u64,
    next_name: u64,
}

impl StatementCache {
    /// Decides how each of a request's `queries` is sent. Statements to make room for the new
    /// ones are named in `evict`: the caller closes them before the request's statements.
    pub fn plan<'q>(
        &mut self,
        queries: impl Iterator<Item = &'q str>,
        limits: CacheLimits,
        evict: &mut Vec<Box<str>>,
    ) -> Vec<Prepared> {
        self.request += 1;
        let request = self.request;
        let queries: Vec<&str> = queries.collect();
        let mut plan = Vec::with_capacity(queries.len());
        // First every hit, so that nothing this request binds is evicted for its new ones.
        for q in &queries {
            plan.push(match self.by_query.get_mut(*q) {
                Some(e) => {
                    e.used = request;
                    Prepared::Cached(e.name.clone())
                }
                None => Prepared::Unnamed,
            });
        }
        let mut named_now: Vec<&str> = Vec::new();
        for (q, p) in queries.iter().zip(plan.iter_mut()) {
            let cacheable = limits.capacity > 0 && q.len() <= limits.max_query;
            if *p != Prepared::Unnamed || !cacheable || named_now.contains(q) {
                continue;
            }
            let pending = named_now.len();
            if self.by_query.len() + pending >= limits.capacity {
                let Some(old) = self.least_recent(request) else {
                    continue;
                };
                let entry = self.by_query.remove(&old).expect("found just now");
                evict.push(entry.name);
            }
            self.next_name += 1;
            *p = Prepared::New(format!("pgwake_sql_{}", self.next_name).into());
            named_now.push(q);
        }
        plan
    }

    /// Records that the backend has prepared `query` as `name`.
    pub fn confirm(&mut self, query: &str, name: Box<str>) {
        let used = self.request;
        self.by_query.insert(query.into(), Entry { name, used });
    }

    /// Forgets every statement (the session was reset, or the backend lost them).
    pub fn clear(&mut self) {
        self.by_query.clear();
    }

    /// The query of the least recently used entry not used by request `current`.
    fn least_recent(&self, current: u64) -> Option<Box<str>> {
        self.by_query
            .iter()
            .filter(|(_, e)| e.used < current)
            .min_by_key(|(_, e)| e.used)
            .map(|(q, _)| q.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CacheLimits = CacheLimits {
        capacity: 2,
        max_query: 32,
    };

    fn plan(c: &mut StatementCache, qs: &[&str], evict: &mut Vec<Box<str>>) -> Vec<Prepared> {
        c.plan(qs.iter().copied(), LIMITS, evict)
    }

    fn confirm_all(c: &mut StatementCache, qs: &[&str], plan: &[Prepared]) {
        for (q, p) in qs.iter().zip(plan) {
            if let Prepared::New(n) = p {
                c.confirm(q, n.clone());
            }
        }
    }

    #[test]
    fn a_confirmed_statement_is_bound_by_name_next_time() {
        let mut c = StatementCache::default();
        let mut evict = Vec::new();
        let first = plan(&mut c, &["select 1"], &mut evict);
        let name = match &first[0] {
            Prepared::New(n) => n.clone(),
            other => panic!("{other:?}"),
        };
        // Not confirmed (the Parse failed or never ran): still parsed anew.
        assert!(matches!(
            plan(&mut c, &["select 1"], &mut evict)[0],
            Prepared::New(_)
        ));
        c.confirm("select 1", name.clone());
        assert_eq!(
            plan(&mut c, &["select 1"], &mut evict),
            [Prepared::Cached(name)]
        );
        assert!(evict.is_empty());
    }

    #[test]
    fn the_least_recently_used_statement_makes_room_but_never_one_in_use() {
        let mut c = StatementCache::default();
        let mut evict = Vec::new();
        for qs in [["a"], ["b"]] {
            let p = plan(&mut c, &qs, &mut evict);
            confirm_all(&mut c, &qs, &p);
        }
        // "a" is used again, so "b" is the one to go for "c".
        plan(&mut c, &["a"], &mut evict);
        let p = plan(&mut c, &["c"], &mut evict);
        assert!(matches!(p[0], Prepared::New(_)));
        assert_eq!(evict.len(), 1);
        confirm_all(&mut c, &["c"], &p);
        assert_eq!(c.by_query.len(), 2);
        assert!(matches!(
            plan(&mut c, &["a"], &mut Vec::new())[0],
            Prepared::Cached(_)
        ));
        // Both cached statements in use: a third new one goes unnamed rather than evict them.
        evict.clear();
        let p = plan(&mut c, &["a", "c", "d"], &mut evict);
        assert!(matches!(p[0], Prepared::Cached(_)));
        assert!(matches!(p[1], Prepared::Cached(_)));
        assert_eq!(p[2], Prepared::Unnamed);
        assert!(evict.is_empty());
    }

    #[test]
    fn long_queries_repeats_and_a_disabled_cache_go_unnamed() {
        let mut c = StatementCache::default();
        let long = "x".repeat(33);
        let p = plan(&mut c, &[&long, "q", "q"], &mut Vec::new());
        assert_eq!(p[0], Prepared::Unnamed);
        assert!(matches!(p[1], Prepared::New(_)));
        assert_eq!(p[2], Prepared::Unnamed);
        let off = CacheLimits {
            capacity: 0,
            max_query: 32,
        };
        let p = c.plan(["z"].into_iter(), off, &mut Vec::new());
        assert_eq!(p, [Prepared::Unnamed]);
        c.clear();
        assert!(c.by_query.is_empty());
    }
}
