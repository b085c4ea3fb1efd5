//! The YAML checks a `PROMETHEUS_MAPPER_YAML` file passes before it is loaded: no aliases (a
//! loader copies the anchored node for each, so a few hundred bytes of nested aliases expand to
//! gigabytes) and nesting at most [`MAX_DEPTH`] deep. Rules files get the same checks from
//! `config::yaml`; the size cap is `rules_dir::read_file_capped`'s.

use yaml_rust2::parser::{Event, Parser};

/// Deepest nesting of mappings and lists accepted (a mapping file needs four levels).
pub(super) const MAX_DEPTH: usize = 32;

/// Refuses aliases and deep nesting, naming the line; leaves every other check to the loader.
pub(super) fn check(source: &str) -> Result<(), String> {
    let mut parser = Parser::new_from_str(source);
    let mut depth = 0usize;
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(next) => next,
            // The loader reports syntax errors in its own words.
            Err(_) => return Ok(()),
        };
        match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => {
                return Err(format!(
                    "line {}: YAML aliases (*name) are not supported in a mapping file",
                    mark.line()
                ));
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "line {}: YAML nested deeper than {MAX_DEPTH} levels",
                        mark.line()
                    ));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Nine levels of ten aliases each: 10^9 copies of "lol" once loaded.
    pub(crate) fn alias_bomb() -> String {
        let mut text = String::from("a0: &a0 [\"lol\"]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        text.push_str("mappings: *a9\n");
        text
    }

    #[test]
    fn an_alias_bomb_is_refused_at_its_first_alias() {
        let err = check(&alias_bomb()).unwrap_err();
        assert_eq!(
            err,
            "line 2: YAML aliases (*name) are not supported in a mapping file"
        );
    }

    #[test]
    fn nesting_is_capped() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(check(&deep(MAX_DEPTH)), Ok(()));
        assert!(
            check(&deep(MAX_DEPTH + 1))
                .unwrap_err()
                .contains("deeper than 32")
        );
    }

    #[test]
    fn anchors_alone_and_syntax_errors_are_left_to_the_loader() {
        assert_eq!(check("a: &x 1\n"), Ok(()));
        assert_eq!(check("mappings: ["), Ok(()));
    }
}
