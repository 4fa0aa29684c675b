//! Rows every dialect reads with the same types (counts per destination), and the reads
//! written once over them.

use diesel::query_dsl::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, QueryableByName};
use outbox_engine::{Gauges, StoreError};
use outbox_sql::Shared;
use outbox_sql::values::{count, limit};

use crate::dialect::{DieselDialect, Query, load};

/// The gauges: the unfinished rows through the due index, the dead ones through the dead
/// index, each at most `bound` rows, and the halted keys from the dead keyed rows.
pub(crate) fn gauges<C>(conn: &mut C, shared: &Shared, bound: usize) -> Result<Gauges, StoreError>
where
    C: DieselDialect,
    i64: ToSql<BigInt, C::Backend>,
    Query<C::Backend>: LoadQuery<'static, C, Unfinished>
        + LoadQuery<'static, C, DeadPerDestination>
        + LoadQuery<'static, C, Halted>,
{
    let n = limit(bound);
    let unfinished: Vec<Unfinished> = load(
        conn,
        C::query(&shared.gauges_unfinished).bind::<BigInt, _>(n),
    )?;
    let dead: Vec<DeadPerDestination> =
        load(conn, C::query(&shared.gauges_dead).bind::<BigInt, _>(n))?;
    Ok(outbox_sql::values::gauges(
        unfinished.into_iter().map(Unfinished::gauges).collect(),
        dead.into_iter()
            .map(|d| (d.destination, count(d.dead)))
            .collect(),
        halted(conn, shared)?,
        bound,
    ))
}

/// Keys held back by a dead head, per destination.
pub(crate) fn halted<C>(conn: &mut C, shared: &Shared) -> Result<Vec<(String, u64)>, StoreError>
where
    C: DieselDialect,
    Query<C::Backend>: LoadQuery<'static, C, Halted>,
{
    let halted: Vec<Halted> = load(conn, C::query(&shared.halted_keys))?;
    Ok(halted
        .into_iter()
        .map(|h| (h.destination, count(h.halted)))
        .collect())
}

/// The one count a `count_dead` statement returns.
pub(crate) fn dead_count<C>(conn: &mut C, query: Query<C::Backend>) -> Result<u64, StoreError>
where
    C: Connection,
    Query<C::Backend>: LoadQuery<'static, C, Dead>,
{
    let rows: Vec<Dead> = load(conn, query)?;
    Ok(rows.first().map_or(0, |r| count(r.dead)))
}

/// A `gauges_dead` row.
#[derive(QueryableByName)]
pub(crate) struct DeadPerDestination {
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead: i64,
}

/// A `halted_keys` row.
#[derive(QueryableByName)]
pub(crate) struct Halted {
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) halted: i64,
}

/// A `count_dead` row.
#[derive(QueryableByName)]
pub(crate) struct Dead {
    #[diesel(sql_type = BigInt)]
    pub(crate) dead: i64,
}

/// A `gauges_unfinished` row.
#[derive(QueryableByName)]
pub(crate) struct Unfinished {
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) pending: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) leased: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) oldest_ms: i64,
}

impl Unfinished {
    fn gauges(self) -> outbox_engine::DestinationGauges {
        let mut d = outbox_engine::DestinationGauges::new(self.destination);
        d.pending = count(self.pending);
        d.leased = count(self.leased);
        d.oldest_pending_age = Some(std::time::Duration::from_millis(count(self.oldest_ms)));
        d
    }
}
