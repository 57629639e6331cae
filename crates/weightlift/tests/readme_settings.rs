//! The settings table of `docs/settings.md` is the settings table: one row per setting, with its variable and
//! default.

#[test]
fn settings_doc_lists_every_setting_with_its_variable_and_default() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/settings.md")).unwrap();
    let table =
        &doc[doc.find("| setting | variable | default | meaning |").expect("docs/settings.md has a settings table")..];
    let rows: Vec<&str> = table.lines().skip(2).take_while(|l| l.starts_with("| ")).collect();
    for s in weightlift::settings::SETTINGS {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| {} |", s.name)))
            .unwrap_or_else(|| panic!("docs/settings.md has no row for setting {}", s.name));
        assert!(row.contains(&format!("`{}`", s.env)), "docs/settings.md row of {} lacks {}: {row}", s.name, s.env);
        assert!(
            row.contains(&format!("| {} |", s.default)),
            "docs/settings.md row of {} lacks default {}: {row}",
            s.name,
            s.default
        );
    }
    assert_eq!(rows.len(), weightlift::settings::SETTINGS.len(), "docs/settings.md lists settings that do not exist");
}
