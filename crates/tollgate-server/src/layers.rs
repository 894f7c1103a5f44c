//! The layering of the configuration: TOML parse errors without quoted lines, and environment
//! overrides applied onto the parsed TOML before it is deserialized (see [`crate::config`]).

use std::collections::BTreeMap;

/// A TOML error by message and line only: toml's `Display` quotes the offending line, which may
/// hold a database URL's password.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
    match line {
        Some(line) => format!("configuration line {line}: {}", e.message()),
        None => format!("configuration: {}", e.message()),
    }
}

/// Applies every `PREFIX…` variable of `env` whose first level is one of `sections` onto
/// `root`: `PREFIX` + levels joined by `__`, lower-cased; numeric levels index arrays.
///
/// # Errors
/// The variable's name and what is wrong with it.
pub fn apply_env(
    root: &mut toml::Value,
    env: &BTreeMap<String, String>,
    prefix: &str,
    sections: &[&str],
) -> Result<(), String> {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        if path.first().is_some_and(|s| sections.contains(&s.as_str())) {
            overlay(root, &path, value).map_err(|e| format!("{name}: {e}"))?;
        }
    }
    Ok(())
}

fn overlay(here: &mut toml::Value, path: &[String], text: &str) -> Result<(), String> {
    let Some((head, rest)) = path.split_first() else {
        *here = typed(Some(here), text);
        return Ok(());
    };
    match here {
        toml::Value::Table(table) if rest.is_empty() => {
            let new = typed(table.get(head), text);
            table.insert(head.clone(), new);
            Ok(())
        }
        toml::Value::Table(table) => {
            let indexed = rest.first().is_some_and(|s| s.parse::<usize>().is_ok());
            if indexed && !table.contains_key(head) {
                return Err(format!("there is no {head:?} entry to override"));
            }
            let child = table
                .entry(head.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            overlay(child, rest, text)
        }
        toml::Value::Array(items) => {
            let index: usize = head
                .parse()
                .map_err(|_| format!("{head:?} is not an array index"))?;
            let item = items
                .get_mut(index)
                .ok_or_else(|| format!("index {index} is out of range"))?;
            overlay(item, rest, text)
        }
        _ => Err(format!("{head:?} is below a value that is not a table")),
    }
}

/// An override's value: of the replaced value's type when there is one, else an integer, a
/// boolean, or a string.
fn typed(existing: Option<&toml::Value>, text: &str) -> toml::Value {
    let as_int = || text.parse::<i64>().ok().map(toml::Value::Integer);
    let as_bool = || text.parse::<bool>().ok().map(toml::Value::Boolean);
    let as_float = || text.parse::<f64>().ok().map(toml::Value::Float);
    let string = || toml::Value::String(text.to_string());
    match existing {
        Some(toml::Value::String(_)) => string(),
        Some(toml::Value::Integer(_)) => as_int().unwrap_or_else(string),
        Some(toml::Value::Boolean(_)) => as_bool().unwrap_or_else(string),
        Some(toml::Value::Float(_)) => as_float().unwrap_or_else(string),
        _ => as_int().or_else(as_bool).unwrap_or_else(string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_keep_the_replaced_type_and_index_arrays() {
        let mut root: toml::Value = toml::from_str::<toml::Table>(
            "[a]\nn = 1\ns = \"x\"\n[[list]]\nname = \"first\"\nsize = 2\n",
        )
        .map(toml::Value::Table)
        .unwrap();
        let env: BTreeMap<String, String> = [
            ("P_A__N", "7"),
            ("P_A__S", "8"),
            ("P_LIST__0__SIZE", "9"),
            ("P_A__NEW", "true"),
            ("OTHER", "ignored"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        apply_env(&mut root, &env, "P_", &["a", "list"]).unwrap();
        assert_eq!(root["a"]["n"].as_integer(), Some(7));
        assert_eq!(root["a"]["s"].as_str(), Some("8"));
        assert_eq!(root["a"]["new"].as_bool(), Some(true));
        assert_eq!(root["list"][0]["size"].as_integer(), Some(9));
        let bad: BTreeMap<String, String> =
            [("P_LIST__3__SIZE".to_string(), "1".to_string())].into();
        assert!(apply_env(&mut root, &bad, "P_", &["list"]).is_err());
    }
}
