//! Rebuilds the server when a migration is added or changed: `sqlx::migrate!`
//! embeds the migrations directory at compile time, and cargo does not track
//! the files a macro reads.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
