//! Every shell block of README.md and docs/ says what it needs; those that need no cluster
//! exit 0 offline, and those marked `sh cluster e2e` exit 0 on a real control plane, in page
//! order (vocabulary: `teamgpu_e2e::docs`).

use teamgpu_e2e::TestCluster;
use teamgpu_e2e::docs::{Block, NEEDS, Workspace, blocks};

fn needing(needs: &str) -> Vec<Block> {
    blocks().into_iter().filter(|b| b.needs == needs).collect()
}

fn run_all(workspace: &Workspace, blocks: &[Block]) {
    let failures: Vec<String> = blocks
        .iter()
        .filter_map(|block| workspace.run(block).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_shell_block_says_what_it_needs() {
    let unmarked: Vec<String> = blocks()
        .into_iter()
        .filter(|block| !NEEDS.contains(&block.needs.as_str()))
        .map(|block| format!("{} (```{})", block.place, block.needs))
        .collect();
    assert!(
        unmarked.is_empty(),
        "shell blocks must be ```sh (runs offline), ```sh cluster, ```sh cluster e2e or ```sh manual: {unmarked:#?}"
    );
}

#[test]
fn every_shell_block_that_needs_no_cluster_exits_zero() {
    let blocks = needing("");
    assert!(
        blocks.len() >= 5,
        "expected the README's and the CLI page's offline commands, found {} blocks",
        blocks.len()
    );
    run_all(&Workspace::new(None), &blocks);
}

#[tokio::test]
async fn the_blocks_marked_e2e_run_on_a_real_control_plane() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let blocks = needing("cluster e2e");
    assert!(
        blocks.len() >= 4,
        "expected the install, dump, look and uninstall blocks, found {}",
        blocks.len()
    );
    let kubeconfig = cluster.kubeconfig().to_path_buf();
    // One after the other, as a person would: each block builds on the ones before it.
    tokio::task::spawn_blocking(move || {
        let workspace = Workspace::new(Some(&kubeconfig));
        for block in &blocks {
            if let Err(failure) = workspace.run(block) {
                panic!("{failure}");
            }
        }
    })
    .await
    .expect("the blocks ran");
}
