"""several recipes per job: jobs.recipes, outputs.recipe

Revision ID: 0002_recipes
Revises: 0001
Create Date: 2026-12-01 20:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0002_recipes'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('recipes', sa.JSON(), nullable=True))
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('recipe', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.drop_column('recipe')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('recipes')
