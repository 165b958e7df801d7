"""The prompt templates of the UnifiedReward releases (CodeGoat24/UnifiedReward), kept as data.

Each string is the release's literal prompt text with its one field ``{prompt}`` (filled with ``str.replace``,
never ``str.format``: the templates hold no other braces, but a prompt may).  Reproduced character for character
from the release's inference scripts (commit ff6f520 of the repository) because a fine-tuned judge is only
calibrated on the exact wording it was trained with; tests pin their lengths and key sentences.

* ``THINK_PAIR_IMAGE_QWEN25``: UnifiedReward-Think-qwen-7b (Qwen2.5-VL), image generation, pairwise
  (``UnifiedReward-Think/inference_qwen/image_generation/qwen_infer_cot_image_generation.py``).
* ``THINK_PAIR_IMAGE_QWEN3``: UnifiedReward-Think-qwen3vl (2b/4b/8b/32b), image generation, pairwise
  (``UnifiedReward-Think/inference_qwen/UnifiedReward-Think-qwen3-inference/qwen3_infer_cot_image_generation.py``;
  also Pref-GRPO's ``get_unifiedreward_think_image_template``).  Its indentation is part of the release's text.
* ``POINT_IMAGE_FINAL_SCORE``: UnifiedReward-qwen (1.0; the base UnifiedReward-Think-qwen-7b was fine-tuned from),
  image generation, pointwise, answer ``Final Score: x`` in 1..5
  (``inference_qwen/image_generation/qwen_point_score_image_generation.py``).
* ``POINT_IMAGE_ACS``: UnifiedReward-2.0-qwen, image generation, pointwise Alignment / Coherence / Style in 1..5
  (``inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py``; also Pref-GRPO's
  ``get_unifiedreward_image_template``).

The Think release has no pointwise image-generation template: its CoT format is pairwise only.
"""

__all__ = ["THINK_PAIR_IMAGE_QWEN25", "THINK_PAIR_IMAGE_QWEN3", "POINT_IMAGE_FINAL_SCORE", "POINT_IMAGE_ACS",
           "TEMPLATES"]

THINK_PAIR_IMAGE_QWEN25 = (
    'Given a caption and two images generated based on this caption, please analyze in detail the two '
    'provided images. Evaluate them on various dimensions such as semantic consistency (how closely the '
    'image content aligns with the caption), aesthetics (composition, color usage, artistic expression), '
    'authenticity (realism and attention to detail), and any other factors you deem relevant. For each '
    'evaluation dimension, provide a score between 1-10 for both images (e.g., Image 1: 8/10, Image 2: '
    '6/10) and provide a concise rationale for the score. Calculate the total score for each image by '
    'summing all dimension scores. Use a chain-of-thought process to detail your reasoning steps, and '
    'enclose all your detailed reasoning within <think> and </think> tags. Then, in the <answer> tag, '
    "output exactly one of the following strings: 'Image 1 is better' or 'Image 2 is better' based on "
    'the total scores. No additional text is allowed in the <answer> section.\n'
    '\n'
    'Example output format:\n'
    '<think>\n'
    '1. Semantic consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...\n'
    '2. Aesthetics: Image 2 (8/10) - ...; Image 1 (8/10) - ...\n'
    '3. Authenticity: Image 1 (8/10) - ...; Image 2 (5/10) - ...\n'
    '[Additional dimensions if any]: Image 2 (8/10) - ...; Image 1 (6/10) - ...\n'
    'Total score:\n'
    'Image 1: 9+8+8+6=31\n'
    'Image 2: 7+8+5+8=28\n'
    '</think>\n'
    '<answer>Image 1 is better</answer>\n'
    '**Note: In the example above, scores and the final answer are placeholders meant only to '
    'demonstrate the format. Your actual evaluation should be based on the quality of two given '
    'images.**\n'
    '\n'
    'Your task is provided as follows:\n'
    'Text Caption: [{prompt}]'
)

THINK_PAIR_IMAGE_QWEN3 = (
    'You are an objective and precise evaluator for image quality comparison. I will provide you with a '
    'text caption and two images generated based on this caption. You must analyze the two images '
    'carefully and determine which image is better.\n'
    '\n'
    '        Evaluation procedure:\n'
    '\n'
    '        1. The caption for the generated images is: 「{prompt}」. You must evaluate the two images '
    'across these core dimensions:\n'
    '        - Semantic consistency (how closely the image content aligns with the caption)\n'
    '        - Aesthetics (composition, color usage, artistic expression)\n'
    '        - Authenticity (realism and attention to detail)\n'
    '\n'
    '        2. You are also encouraged to add up to two additional evaluation dimensions if they are '
    'relevant to the specific caption or images (e.g., creativity, spatial layout, fine-grained detail). '
    'If no extra dimensions are relevant, just keep the three core dimensions.\n'
    '\n'
    '        3. For each evaluation dimension:\n'
    '        - Provide a score between 1–10 for both Image 1 and Image 2\n'
    '        - Provide a short rationale for each score (2–5 short sentences)\n'
    '        - The evaluation must follow exactly this format with line breaks and indentation:\n'
    '            Dimension name: \n'
    '                Image 1 (x/10) - rationale; \n'
    '                Image 2 (y/10) - rationale\n'
    '\n'
    '        4. After evaluating all dimensions, calculate the total score for each image and show the '
    'calculation explicitly, following this exact format:\n'
    '            Total score:\n'
    '            Image 1: x+x+x=total\n'
    '            Image 2: y+y+y=total\n'
    '\n'
    '        5. Wrap all reasoning and scoring strictly within <think> and </think> tags.\n'
    '\n'
    '        6. After </think>, output the final judgment strictly inside <answer> and </answer> tags, '
    'containing only one of:\n'
    '        - Image 1 is better\n'
    '        - Image 2 is better\n'
    '\n'
    '        Constraints:\n'
    '        - You must strictly follow the line breaks, indentation, and formatting shown in the '
    'example below.\n'
    '        - Do not merge multiple dimensions into one line. Each dimension must follow the 3-line '
    'block format shown below.\n'
    '        - Do not use Markdown formatting, bullet points, bold text, or headings.\n'
    '        - Do not output explanations outside <think> and <answer>.\n'
    '        - The <answer> tag must contain only the final string with no extra words.\n'
    '\n'
    '        Required output format:\n'
    '\n'
    '        <think>\n'
    '        1. Semantic consistency: \n'
    '            Image 1 (9/10) - ...; \n'
    '            Image 2 (7/10) - ...\n'
    '        2. Aesthetics: \n'
    '            Image 1 (8/10) - ...; \n'
    '            Image 2 (8/10) - ...\n'
    '        3. Authenticity: \n'
    '            Image 1 (8/10) - ...; \n'
    '            Image 2 (5/10) - ...\n'
    '        [Additional dimension if any]: \n'
    '            Image 1 (7/10) - ...; \n'
    '            Image 2 (8/10) - ...\n'
    '        [Additional dimension if any]: \n'
    '            Image 1 (6/10) - ...; \n'
    '            Image 2 (7/10) - ...\n'
    '        Total score:\n'
    '        Image 1: 9+8+8+7+6=38\n'
    '        Image 2: 7+8+5+8+7=35\n'
    '        </think>\n'
    '        <answer>Image 1 is better</answer>\n'
    '\n'
    '        Note: The example above is only to illustrate the exact format (line breaks, indentation, '
    'symbols, and style). Your actual evaluation must follow this format exactly, but be based on the '
    'given caption and images.\n'
    '        '
)

POINT_IMAGE_FINAL_SCORE = (
    'You are given a text caption and a generated image based on that caption. Your task is to evaluate '
    'this image based on two key criteria:\n'
    '1. Alignment with the Caption: Assess how well this image aligns with the provided caption. '
    'Consider the accuracy of depicted objects, their relationships, and attributes as described in the '
    'caption.\n'
    '2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail '
    'preservation, color accuracy, and overall aesthetic appeal.\n'
    'Extract key elements from the provided text caption, evaluate their presence in the generated image '
    "using the format: 'element (type): value' (where value=0 means not generated, and value=1 means "
    "generated), and assign a score from 1 to 5 after 'Final Score:'.\n"
    'Your task is provided as follows:\n'
    'Text Caption: [{prompt}]'
)

POINT_IMAGE_ACS = (
    'You are presented with a generated image and its associated text caption. Your task is to analyze '
    'the image across multiple dimensions in relation to the caption. Specifically:\n'
    'Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n'
    '- Alignment Score: How well the image matches the caption in terms of content.\n'
    '- Coherence Score: How logically consistent the image is (absence of visual glitches, object '
    'distortions, etc.).\n'
    '- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n'
    '\n'
    'Output your evaluation using the format below:\n'
    '\n'
    'Alignment Score (1-5): X\n'
    'Coherence Score (1-5): Y\n'
    'Style Score (1-5): Z\n'
    '\n'
    'Your task is provided as follows:\n'
    'Text Caption: [{prompt}]'
)

# name -> (template, kind): the ``template=`` names accepted by :mod:`flow_grpo.rewards.unified_reward`
TEMPLATES = {
    "think_qwen25": (THINK_PAIR_IMAGE_QWEN25, "pair"),
    "think_qwen3": (THINK_PAIR_IMAGE_QWEN3, "pair"),
    "final_score": (POINT_IMAGE_FINAL_SCORE, "point"),
    "acs": (POINT_IMAGE_ACS, "point"),
}
