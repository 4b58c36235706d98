//! Hashes a prompt of token IDs into chained block hashes and shows how prefixes share them.
//!
//! Run: `cargo run --release --example hash_prompt [BLOCK_SIZE]`

use prefix_router::{HashAlgorithm, PrefixHasher};

fn main() {
    let block_size = match std::env::args().nth(1).map(|s| s.parse::<usize>()) {
        None => 16,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("error: block size must be a positive integer: {e}");
            std::process::exit(2);
        }
    };
    let hasher = match PrefixHasher::new(block_size) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // A common system prompt followed by two different questions.
    let system: Vec<u32> = (0..(block_size * 3) as u32).map(|i| 100_000 + i).collect();
    let q1: Vec<u32> = [system.clone(), vec![151_000; block_size * 2 + 5]].concat();
    let q2: Vec<u32> = [system.clone(), vec![7; block_size * 2]].concat();

    for (name, prompt) in [("question 1", &q1), ("question 2", &q2)] {
        println!(
            "{name}: {} tokens, block size {block_size} -> {} full blocks",
            prompt.len(),
            hasher.full_blocks(prompt.len())
        );
        for (i, h) in hasher.hash(prompt).iter().enumerate() {
            println!("  block {i:>2}: {:#018x}", h.get());
        }
    }
    let (a, b) = (hasher.hash(&q1), hasher.hash(&q2));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    println!("shared leading blocks: {shared} (the system prompt)");

    let salted = hasher.hash_salted(b"lora:finance", &q1);
    println!(
        "with salt \"lora:finance\" question 1 shares {} blocks with the unsalted hashes",
        salted.iter().filter(|h| a.contains(h)).count()
    );
    let sha = PrefixHasher::with_algorithm(block_size, HashAlgorithm::Sha256).map(|h| h.hash(&q1));
    if let Ok(sha) = sha {
        println!("Sha256 block 0 of question 1: {:#018x}", sha[0].get());
    }
}
