use csv_core::{ReadFieldResult, Reader};
use std::io::Read;

const HELP: &str = "Print one column of a CSV file (with a header row) from standard input.

Usage: csvcol --column <NAME>

Prints the column's value in each record, one per line (quotes removed).
Exits with status 1 when no column has that name.

Options:
  -c, --column <NAME>   The column's name in the header row
  -h, --help            Print help";

/// Every record of `data`, each a list of its fields, unquoted.
fn records(data: &[u8]) -> Vec<Vec<String>> {
    let mut reader = Reader::new();
    let mut input = data;
    let mut buffer = [0u8; 4096];
    let (mut records, mut record, mut field) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let (result, read, written) = reader.read_field(input, &mut buffer);
        input = &input[read..];
        field.extend_from_slice(&buffer[..written]);
        match result {
            ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => {}
            ReadFieldResult::Field { record_end } => {
                record.push(String::from_utf8_lossy(&field).into_owned());
                field.clear();
                if record_end {
                    records.push(std::mem::take(&mut record));
                }
            }
            ReadFieldResult::End => return records,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let name = args
        .iter()
        .position(|a| a == "--column" || a == "-c")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--column=").map(str::to_owned)))
        .unwrap_or_else(|| {
            eprintln!("csvcol: give --column NAME");
            std::process::exit(2);
        });
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    let all = records(&input);
    let index = match all.first().and_then(|header| header.iter().position(|h| *h == name)) {
        Some(index) => index,
        None => {
            eprintln!("csvcol: no column {:?}", name);
            std::process::exit(1);
        }
    };
    for record in &all[1..] {
        println!("{}", record.get(index).map(String::as_str).unwrap_or(""));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_fields() {
        let all = super::records(b"a,b\n\"x, y\",\"say \"\"hi\"\"\"\n");
        assert_eq!(all, vec![vec!["a", "b"], vec!["x, y", "say \"hi\""]]);
    }
}
