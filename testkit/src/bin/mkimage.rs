//! `mkimage RECIPE OUTPUT`: build a raw image from a vector recipe.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: mkimage RECIPE OUTPUT");
        std::process::exit(2);
    }
    let recipe = testkit::Recipe::parse(&args[1]).unwrap_or_else(|e| {
        eprintln!("mkimage: {e}");
        std::process::exit(2);
    });
    if let Err(e) = recipe.write_image(std::path::Path::new(&args[2])) {
        eprintln!("mkimage: {}: {e}", args[2]);
        std::process::exit(1);
    }
}
