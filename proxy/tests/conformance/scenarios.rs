//! The named scenarios, by family. Each family's cases come from issue 26 and from the ways a
//! client reaches the same kind of state.

#[path = "scenarios/cancels.rs"]
mod cancels;
#[path = "scenarios/catalog.rs"]
mod catalog;
#[path = "scenarios/contexts.rs"]
mod contexts;
#[path = "scenarios/locks.rs"]
mod locks;
#[path = "scenarios/pins.rs"]
mod pins;
#[path = "scenarios/prepared.rs"]
mod prepared;
#[path = "scenarios/schema.rs"]
mod schema;
#[path = "scenarios/settings.rs"]
mod settings;
#[path = "scenarios/temporary.rs"]
mod temporary;

use super::run::Scenario;

pub fn all() -> Vec<Scenario> {
    let mut all = Vec::new();
    all.extend(settings::all());
    all.extend(temporary::all());
    all.extend(prepared::all());
    all.extend(schema::all());
    all.extend(pins::all());
    all.extend(cancels::all());
    all.extend(locks::all());
    all.extend(contexts::all());
    all.extend(catalog::all());
    let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "scenario names are unique");
    all
}
