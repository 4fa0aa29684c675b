//! Rows every dialect reads with the same types (counts per destination), and the reads
//! written once over them.

use diesel::query_dsl::LoadQuery;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, QueryableByName};
use outbox_engine::{Gauges, StoreError};
use outbox_sql::Shared;
use outbox_sql::values::{count, limit};

use crate::dialect::{DieselDialect, Query, execute, load};
use crate::migrate::in_transaction;

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

/// Deletes the counter rows of at most `bound` keys left with no pending, leased or dead
/// row; returns how many. Each key is locked, then judged again by a statement of its own
/// (see `Shared::forget_key` in `outbox-sql`); SQLite, with one writer at a time, only
/// runs the delete.
pub(crate) fn forget_idle_keys<C>(
    conn: &mut C,
    shared: &Shared,
    bound: usize,
) -> Result<u64, StoreError>
where
    C: DieselDialect,
    i64: ToSql<BigInt, C::Backend>,
    String: ToSql<Text, C::Backend>,
    Query<C::Backend>: LoadQuery<'static, C, IdleKey> + ExecuteDsl<C>,
{
    let idle: Vec<IdleKey> = load(
        conn,
        C::query(&shared.idle_keys).bind::<BigInt, _>(limit(bound)),
    )?;
    let mut forgotten = 0;
    for IdleKey { partition_key: key } in idle {
        let forget = C::query(&shared.forget_key).bind::<Text, _>(key.clone());
        if C::DIALECT == outbox_sql::Dialect::Sqlite {
            forgotten += execute(conn, forget)?;
            continue;
        }
        forgotten += in_transaction(conn, |conn| {
            let held: Vec<IdleKey> = load(conn, C::query(&shared.lock_key).bind::<Text, _>(key))?;
            if held.is_empty() {
                return Ok(0);
            }
            execute(conn, forget)
        })?;
    }
    Ok(forgotten)
}

/// An `idle_keys` or `lock_key` row.
#[derive(QueryableByName)]
pub(crate) struct IdleKey {
    #[diesel(sql_type = Text)]
    pub(crate) partition_key: String,
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
