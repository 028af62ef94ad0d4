//! The `switchyard-server token` commands: create, list, revoke and rotate
//! the bearer tokens kept in the store. They work on the database directly
//! (whoever holds its URL holds everything already), so no token can mint,
//! list or revoke tokens over the API. Tokens are printed once, when made;
//! only their SHA-256 is stored.

use anyhow::{Context, bail};

use crate::auth::{Role, generate_token, hash_token, now_ms};
use crate::config::TokenCommand;
use crate::model::TokenRecord;
use crate::store::Store;

fn secs_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// Runs one token command against `store`, printing to standard output.
pub async fn run(store: &dyn Store, command: TokenCommand) -> anyhow::Result<()> {
    let now = now_ms();
    match command {
        TokenCommand::Create {
            name,
            namespace,
            role,
            expires_in_secs,
            agent_names,
        } => {
            let Some(role) = Role::parse(&role) else {
                bail!("--role must be agent, submitter or operator");
            };
            if !agent_names.is_empty() && role != Role::Agent {
                bail!("--agent-names binds agent tokens only");
            }
            if let Some(bad) = agent_names.iter().find(|n| n.is_empty() || n.contains(',')) {
                bail!("--agent-names: {bad:?} is not a name or pattern");
            }
            let token = generate_token();
            let mut record = TokenRecord::new(name, namespace, role, now);
            record.expires_at_ms = expires_in_secs.map(|s| now.saturating_add(secs_ms(s)));
            record.agent_names = agent_names;
            store
                .insert_token(&record, &hash_token(&token))
                .await
                .context("storing the token (is the name already used in this namespace?)")?;
            // The only time the token is shown; only its hash is stored.
            println!("{token}");
            eprintln!(
                "token {:?} for namespace {:?} with role {}: keep it now, it cannot be shown again",
                record.name,
                record.namespace,
                record.role.as_str()
            );
        }
        TokenCommand::List { namespace } => {
            let tokens = store.list_tokens(&namespace).await?;
            println!(
                "{:<20} {:<16} {:<10} {:<12} {:<10} {:<24} {:<24} {:<24} AGENT NAMES",
                "NAME", "NAMESPACE", "ROLE", "ID", "STATE", "CREATED", "LAST USED", "EXPIRES"
            );
            for t in tokens {
                let state = if t.revoked_at_ms.is_some_and(|at| at <= now) {
                    "revoked"
                } else if t.expires_at_ms.is_some_and(|at| at <= now) {
                    "expired"
                } else if t.revoked_at_ms.is_some() {
                    "rotated"
                } else {
                    "valid"
                };
                println!(
                    "{:<20} {:<16} {:<10} {:<12} {:<10} {:<24} {:<24} {:<24} {}",
                    t.name,
                    t.namespace,
                    t.role.as_str(),
                    t.id,
                    state,
                    time(Some(t.created_at_ms)),
                    time(t.last_used_at_ms),
                    time(t.expires_at_ms.or(t.revoked_at_ms.filter(|at| *at > now))),
                    t.agent_names.join(",")
                );
            }
        }
        TokenCommand::Revoke { name, namespace } => {
            let revoked = store.revoke_token(&namespace, &name, now).await?;
            if revoked == 0 {
                bail!("no token called {name:?} in namespace {namespace:?} is valid");
            }
            eprintln!(
                "revoked {revoked} token(s) called {name:?} in namespace {namespace:?}; \
                 every replica refuses them within a second"
            );
        }
        TokenCommand::Rotate {
            name,
            namespace,
            grace_secs,
            expires_in_secs,
        } => {
            let token = generate_token();
            let expires = expires_in_secs.map(|s| now.saturating_add(secs_ms(s)));
            let Some(record) = store
                .rotate_token(
                    &namespace,
                    &name,
                    &hash_token(&token),
                    expires,
                    now,
                    secs_ms(grace_secs),
                )
                .await?
            else {
                bail!("no current token called {name:?} in namespace {namespace:?}");
            };
            println!("{token}");
            eprintln!(
                "token {:?} in namespace {:?} rotated: the new one is printed above (id {}); \
                 the old one stops working in {grace_secs} s",
                record.name, record.namespace, record.id
            );
        }
    }
    Ok(())
}

/// A time for people (RFC 3339, UTC), or `-`.
fn time(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "-".to_owned())
}
