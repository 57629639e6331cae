//! The README's settings table is the settings table: one row per setting, with its variable and default.

#[test]
fn readme_lists_every_setting_with_its_variable_and_default() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let table =
        &readme[readme.find("| setting | variable | default | meaning |").expect("README has a settings table")..];
    let rows: Vec<&str> = table.lines().skip(2).take_while(|l| l.starts_with("| ")).collect();
    for s in weightlift::settings::SETTINGS {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| {} |", s.name)))
            .unwrap_or_else(|| panic!("README has no row for setting {}", s.name));
        assert!(row.contains(&format!("`{}`", s.env)), "README row of {} lacks {}: {row}", s.name, s.env);
        assert!(
            row.contains(&format!("| {} |", s.default)),
            "README row of {} lacks default {}: {row}",
            s.name,
            s.default
        );
    }
    assert_eq!(rows.len(), weightlift::settings::SETTINGS.len(), "README lists settings that do not exist");
}
